"""ROG's postprocessing: a small U-Net that enhances blurry, noisy reconstructions.

Yue et al. (App. A) trains a U-Net generator (conv–InstanceNorm–ReLU blocks,
skip connections) on ImageNet crops degraded by random down-sampling, blur and
Gaussian noise. Here the network is smaller (3 down-samplings, 16 base
channels, residual output) and is trained by `gradleak train-postprocessor` on
offline photos shipped with scikit-image, scikit-learn and matplotlib — never
on an evaluation dataset. Weights are stored as float16 safetensors in
gradleak/assets/rog_unet.safetensors and only ever loaded with safetensors.
"""
from __future__ import annotations

import math
import random
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import GradleakError
from ..options import path_kind

DEFAULT_WEIGHTS = Path(__file__).resolve().parent.parent / "assets" / "rog_unet.safetensors"


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), nn.InstanceNorm2d(cout, affine=True), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1), nn.InstanceNorm2d(cout, affine=True), nn.ReLU(inplace=True))


class EnhancementUNet(nn.Module):
    """RGB image in [0, 1] → enhanced image (input + predicted residual)."""

    def __init__(self, base: int = 16, depth: int = 3):
        super().__init__()
        widths = [base * 2 ** i for i in range(depth + 1)]
        self.depth = depth
        self.encoders = nn.ModuleList([_block(3, widths[0])] +
                                      [_block(widths[i], widths[i + 1]) for i in range(depth)])
        self.ups = nn.ModuleList([nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
                                  for i in reversed(range(depth))])
        self.decoders = nn.ModuleList([_block(2 * widths[i], widths[i]) for i in reversed(range(depth))])
        self.head = nn.Conv2d(widths[0], 3, 1)
        # Start as the identity map so training only ever learns a correction.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        h = x
        for i, enc in enumerate(self.encoders):
            h = enc(h if i == 0 else F.max_pool2d(h, 2))
            skips.append(h)
        skips.pop()
        for up, dec in zip(self.ups, self.decoders):
            h = dec(torch.cat([up(h), skips.pop()], 1))
        return x + self.head(h)


def load_enhancer(path: str | Path | None = None) -> EnhancementUNet:
    """The trained network from a safetensors file (default: the shipped weights)."""
    return _load_cached(str(Path(path) if path else DEFAULT_WEIGHTS))


@lru_cache(maxsize=4)
def _load_cached(path: str) -> EnhancementUNet:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if path_kind(path, "postprocessor weights") != "file":
        raise GradleakError(f"postprocessor weights '{path}' not found; run `gradleak train-postprocessor`")
    try:
        state = load_file(path)
    except (SafetensorError, OSError) as exc:
        raise GradleakError(f"cannot read postprocessor weights '{path}': {exc}") from None
    base = int(state["encoders.0.0.weight"].shape[0])
    depth = sum(1 for k in state if k.startswith("encoders.") and k.endswith(".0.weight")) - 1
    model = EnhancementUNet(base, depth)
    try:
        model.load_state_dict({k: v.float() for k, v in state.items()})
    except RuntimeError as exc:
        raise GradleakError(f"postprocessor weights '{path}' do not fit the U-Net: {exc}") from None
    return model.eval().requires_grad_(False)


@torch.no_grad()
def enhance(images: torch.Tensor, model: EnhancementUNet | None = None) -> torch.Tensor:
    """Enhance a batch (N, C, H, W) in [0, 1]; C = 1 images go through as gray RGB.
    Sides are reflect-padded to a multiple of 2**depth and cropped back."""
    model = model or load_enhancer()
    n, c, h, w = images.shape
    x = images.float().expand(n, 3, h, w) if c == 1 else images.float()
    m = 2 ** model.depth
    ph, pw = (-h) % m, (-w) % m
    if ph or pw:
        mode = "reflect" if ph < h and pw < w else "replicate"
        x = F.pad(x, (0, pw, 0, ph), mode=mode)
    out = model(x.to(next(model.parameters()).device))[..., :h, :w].to(images.device)
    if c == 1:
        out = out.mean(1, keepdim=True)
    return out.clamp(0, 1)


_DOWN_MODES = ("nearest", "bilinear", "bicubic", "area")


def _gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    radius = max(1, math.ceil(2 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=x.dtype)
    k = torch.exp(-t ** 2 / (2 * sigma ** 2))
    k = k / k.sum()
    c = x.shape[1]
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="reflect"), k.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(F.pad(x, (0, 0, radius, radius), mode="reflect"), k.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)


def degrade(x: torch.Tensor, rng: random.Random, factor: int = 4, max_noise: float = 0.05,
            max_blur: float = 1.5) -> torch.Tensor:
    """Yue et al.'s synthetic degradation: blur, ×1/factor down-sampling by a random
    method and Gaussian noise in a random order, then bicubic up-sampling back —
    what a ROG latent decoded by bicubic up-sampling looks like."""
    h, w = x.shape[-2:]
    ops = ["down", "noise", "blur"]
    rng.shuffle(ops)
    small = False
    for op in ops:
        if op == "down":
            mode = rng.choice(_DOWN_MODES)
            kwargs = {"antialias": True} if mode in ("bilinear", "bicubic") else {}
            x = F.interpolate(x, size=(h // factor, w // factor), mode=mode, **kwargs)
            small = True
        elif op == "noise":
            sigma = rng.uniform(0, max_noise)
            x = x + sigma * torch.randn(x.shape, generator=torch.Generator().manual_seed(rng.getrandbits(32)))
        elif op == "blur" and rng.random() < 0.7 and min(x.shape[-2:]) > 8:
            x = _gaussian_blur(x, rng.uniform(0.3, max_blur / (factor if small else 1) + 0.3))
    return F.interpolate(x, size=(h, w), mode="bicubic", align_corners=False).clamp(0, 1)
