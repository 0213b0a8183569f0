"""Untrained convolutional generators for the deep image prior (Ulyanov, Vedaldi,
Lempitsky): x̂ = U_θ(z₀), optimised through θ. `copies` runs one generator per
image as grouped convolutions."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import GradleakError
from ...registry import Registry


class _Conv(nn.Module):
    """Conv2d applied with separate weights to each of `copies` images: the batch
    is folded into channels and convolved with groups=copies (one DIP per image
    at the cost of one shared network)."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, copies: int = 1):
        super().__init__()
        self.copies, self.cout = copies, cout
        self.conv = nn.Conv2d(cin * copies, cout * copies, kernel, stride=stride, padding=kernel // 2,
                              groups=copies)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copies == 1:
            return self.conv(x)
        if x.shape[0] != self.copies:
            raise GradleakError(f"feature-prior: generator built for {self.copies} images got {x.shape[0]}")
        y = self.conv(x.reshape(1, -1, *x.shape[2:]))
        return y.reshape(self.copies, self.cout, *y.shape[2:])


def _conv_block(cin: int, cout: int, kernel: int = 3, stride: int = 1, copies: int = 1) -> nn.Sequential:
    return nn.Sequential(_Conv(cin, cout, kernel, stride, copies), nn.GroupNorm(min(8, cout), cout),
                         nn.LeakyReLU(0.2))


class UpsampleGenerator(nn.Module):
    """Noise at 1/4 resolution → two bilinear ×2 stages → sigmoid image (~75 k
    parameters). Its output is low-pass by construction: blobs, no edges."""

    def __init__(self, channels: int, size: tuple[int, int], copies: int = 1, noise_channels: int = 32,
                 hidden: int = 64):
        super().__init__()
        self.size = size
        self.noise_shape = (noise_channels, max(size[0] // 4, 1), max(size[1] // 4, 1))
        self.low = _conv_block(noise_channels, hidden, copies=copies)
        self.mid = _conv_block(hidden, hidden, copies=copies)
        self.high = _conv_block(hidden, hidden // 2, copies=copies)
        self.out = _Conv(hidden // 2, channels, 3, copies=copies)

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        h, w = self.size
        x = self.low(noise)
        x = self.mid(F.interpolate(x, size=(max(h // 2, 1), max(w // 2, 1)), mode="bilinear",
                                   align_corners=False))
        x = self.high(F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False))
        return torch.sigmoid(self.out(x))


class SkipGenerator(nn.Module):
    """Ulyanov et al.'s "skip" deep image prior, sized for small images: an
    encoder of strided conv blocks from full-resolution noise, a bilinear
    decoder, and thin (4-channel) skip connections at every scale, so edges and
    texture can reach the output. GroupNorm keeps images of a batch independent
    (App. F's U-Net uses GroupNorm as well)."""

    def __init__(self, channels: int, size: tuple[int, int], copies: int = 1, noise_channels: int = 16,
                 widths: tuple[int, ...] = (32, 64, 64), skip: int = 4):
        super().__init__()
        self.size = size
        self.noise_shape = (noise_channels, *size)
        self.down, self.skips, self.up = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        cin = noise_channels
        for width in widths:
            self.skips.append(_conv_block(cin, skip, kernel=1, copies=copies))
            self.down.append(nn.Sequential(_conv_block(cin, width, stride=2, copies=copies),
                                           _conv_block(width, width, copies=copies)))
            cin = width
        for level in reversed(range(len(widths))):
            out = widths[max(level - 1, 0)]
            self.up.append(nn.Sequential(nn.GroupNorm(1, cin + skip), _conv_block(cin + skip, out, copies=copies),
                                         _conv_block(out, out, kernel=1, copies=copies)))
            cin = out
        self.out = _Conv(cin, channels, 1, copies=copies)

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        skips, x = [], noise
        for skip, down in zip(self.skips, self.down):
            skips.append(skip(x))
            x = down(x)
        for up, s in zip(self.up, reversed(skips)):
            x = F.interpolate(x, size=s.shape[-2:], mode="bilinear", align_corners=False)
            x = up(torch.cat([x, s], 1))
        return torch.sigmoid(self.out(x))


# The generators an attack names in its options (feature-prior's `generator`): a class built as
# `cls(channels, (height, width), copies=...)`, an nn.Module with a `noise_shape`. Plugins add
# theirs with `GENERATORS.register` or the entry point group `gradleak.generators`.
GENERATORS: Registry = Registry("generator", {
    "skip": "gradleak.attacks.engine.generators:SkipGenerator",
    "upsample": "gradleak.attacks.engine.generators:UpsampleGenerator",
})
