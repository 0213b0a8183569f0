"""Seeded, validated model construction plus the shape helpers builders share.

`build` is the single entry point (via `gradleak.models.build_model`): it checks
the spec, then calls the registered builder inside a forked RNG so the same
seed always yields the same weights and the caller's global RNG is untouched.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import GradleakError
from .base import ACTIVATIONS, ModelSpec


def build(spec: ModelSpec, builder) -> nn.Module:
    """Validate `spec`, build the model with `builder` (the registered factory) and
    seed `spec.seed`; return it float32 in train mode."""
    if spec.activation is not None and spec.activation not in ACTIVATIONS:
        raise GradleakError(
            f"unknown activation '{spec.activation}'; choose from: {', '.join(ACTIVATIONS)}"
        )
    shape = tuple(spec.input_shape)
    if len(shape) not in (1, 3) or any(int(d) != d or d < 1 for d in shape):
        raise GradleakError(
            f"model '{spec.name}': input shape {shape} must be (C, H, W) for images or (D,) for tabular data"
        )
    if int(spec.num_classes) < 1:
        raise GradleakError(f"model '{spec.name}': num_classes must be at least 1 (got {spec.num_classes})")
    # fork_rng restores the global CPU generator afterwards; devices=[] avoids touching CUDA.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(spec.seed))
        model = builder(spec)
    return model.float().train()


def act_name(spec: ModelSpec, default: str) -> str:
    """The spec's activation, or the architecture's own default when none was given."""
    return spec.activation if spec.activation is not None else default


def image_shape(spec: ModelSpec, min_size: int = 1) -> tuple[int, int, int]:
    """(C, H, W) of an image spec; a clear error for tabular data or too-small images."""
    shape = tuple(int(d) for d in spec.input_shape)
    if len(shape) != 3:
        raise GradleakError(
            f"model '{spec.name}' needs image inputs (C, H, W); got shape {shape} "
            "(use 'mlp' or 'twolayer' for tabular data)"
        )
    channels, height, width = shape
    if min(height, width) < min_size:
        raise GradleakError(
            f"model '{spec.name}' needs inputs of at least {min_size}×{min_size} pixels; "
            f"got {height}×{width}"
        )
    return channels, height, width


def flat_dim(spec: ModelSpec) -> int:
    """Number of input features once flattened (for fully connected models)."""
    return math.prod(int(d) for d in spec.input_shape)


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0, ceil: bool = False) -> int:
    """Spatial output size of a conv / pool layer (PyTorch's formula)."""
    span = size + 2 * padding - kernel
    steps = -(-span // stride) if ceil else span // stride
    out = steps + 1
    if ceil and (out - 1) * stride >= size + padding:
        out -= 1  # PyTorch drops a last window that would start in the right padding
    return out
