"""ResNet-18 (He et al. 2016, BasicBlock [2,2,2,2]) and the CIFAR ResNet-20.

ResNet-18 uses the CIFAR stem (3×3 conv, stride 1, no max-pool) below 128 px
and the ImageNet stem (7×7 conv stride 2 + 3×3 max-pool) from 128 px on.
ResNet-20 is the 3-stage ×3-block CIFAR network with 16/32/64 channels and the
paper's parameter-free "option A" shortcuts (0.27 M parameters). Both end in
adaptive average pooling, so any resolution works, and `width` multiplies every
channel count (wide-ResNet style).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..options import build_options, check
from .base import ModelSpec, make_activation, size_checked
from .building import act_name, image_shape


@dataclass(frozen=True)
class ResNetOptions:
    width: int = 1  # channel multiplier

    def __post_init__(self) -> None:
        check(self.width >= 1, "model 'resnet' option 'width' must be at least 1")


class PadShortcut(nn.Module):
    """Option-A shortcut: subsample by `stride` and zero-pad the new channels."""

    kink_free = True  # linear, so a finite difference in the weights sees no kink (attacks.replay.finite_difference)

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.stride = stride
        self.extra = planes - in_planes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))


class BasicBlock(nn.Module):
    """Two 3×3 conv-bn layers plus shortcut; `shortcut` is 'conv' (option B) or 'pad' (option A)."""

    def __init__(self, in_planes: int, planes: int, stride: int, act: str, shortcut: str = "conv"):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = make_activation(act)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.act2 = make_activation(act)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            if shortcut == "pad":
                self.shortcut = PadShortcut(in_planes, planes, stride)
            else:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act2(out + self.shortcut(x))


class ResNet(nn.Module):
    """stem → stages of BasicBlocks → adaptive avg-pool → flatten → linear."""

    def __init__(self, stem: nn.Sequential, stem_channels: int, stages: list[tuple[int, int, int]],
                 num_classes: int, act: str, shortcut: str):
        super().__init__()
        self.stem = stem
        blocks: list[nn.Module] = []
        in_planes = stem_channels
        for planes, count, stride in stages:
            for i in range(count):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1, act, shortcut))
                in_planes = planes
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(in_planes, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.flatten(self.pool(self.layers(self.stem(x)))))


def _stem(channels: int, out: int, act: str, imagenet: bool) -> nn.Sequential:
    if imagenet:
        return nn.Sequential(
            nn.Conv2d(channels, out, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(out),
            make_activation(act), nn.MaxPool2d(3, stride=2, padding=1),
        )
    return nn.Sequential(nn.Conv2d(channels, out, 3, stride=1, padding=1, bias=False),
                         nn.BatchNorm2d(out), make_activation(act))


@size_checked
def build_resnet18(spec: ModelSpec) -> nn.Module:
    """ResNet-18; CIFAR stem below 128 px, ImageNet stem from 128 px."""
    opts: ResNetOptions = build_options(ResNetOptions, spec.options, "model 'resnet18'")
    channels, height, width = image_shape(spec, min_size=1)
    act = act_name(spec, "relu")
    base = 64 * opts.width
    stem = _stem(channels, base, act, imagenet=min(height, width) >= 128)
    stages = [(base, 2, 1), (2 * base, 2, 2), (4 * base, 2, 2), (8 * base, 2, 2)]
    return ResNet(stem, base, stages, spec.num_classes, act, shortcut="conv")


@size_checked
def build_resnet20(spec: ModelSpec) -> nn.Module:
    """CIFAR ResNet-20: 3 stages × 3 blocks, 16/32/64 channels, option-A shortcuts."""
    opts: ResNetOptions = build_options(ResNetOptions, spec.options, "model 'resnet20'")
    channels, _, _ = image_shape(spec, min_size=1)
    act = act_name(spec, "relu")
    base = 16 * opts.width
    stem = _stem(channels, base, act, imagenet=False)
    stages = [(base, 3, 1), (2 * base, 3, 2), (4 * base, 3, 2)]
    return ResNet(stem, base, stages, spec.num_classes, act, shortcut="pad")
