"""Spec-driven reshaping of a loaded dataset: centre crop, resize, channel count.

Applied once after loading so every loader stays at its native resolution and
the same options work for every image dataset.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..errors import GradleakError, OptionRangeError
from ..modalities import modality as modality_of
from ..options import MAX_DATA_BYTES, MAX_IMAGE_SIDE, MIN_IMAGE_SIDE, check_size
from .base import Dataset, DatasetSpec

# ITU-R BT.601 luma weights, the usual RGB -> grayscale conversion.
_LUMA = (0.299, 0.587, 0.114)


def resize_images(x: torch.Tensor, size: int | tuple[int, int]) -> torch.Tensor:
    """Bilinear, antialiased resize of (N, C, H, W) images in [0, 1], clamped to [0, 1]."""
    hw = (size, size) if isinstance(size, int) else tuple(size)
    if tuple(x.shape[-2:]) == hw:
        return x
    out = F.interpolate(x, size=hw, mode="bilinear", align_corners=False, antialias=True)
    return out.clamp_(0.0, 1.0)


def center_crop(x: torch.Tensor, side: int) -> torch.Tensor:
    """Central side x side window of (N, C, H, W) images."""
    h, w = x.shape[-2:]
    top, left = (h - side) // 2, (w - side) // 2
    return x[..., top:top + side, left:left + side]


def to_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """1 channel by luminance, 3 channels by replicating gray."""
    c = x.shape[1]
    if c == channels:
        return x
    if channels == 1 and c == 3:
        weights = torch.tensor(_LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        return (x * weights).sum(dim=1, keepdim=True).clamp_(0.0, 1.0)
    if channels == 3 and c == 1:
        return x.repeat(1, 3, 1, 1)
    raise GradleakError(f"cannot convert {c}-channel images to {channels} channels")


def _positive(value: int | None, option: str, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GradleakError(f"dataset '{name}': {option} must be a positive integer, got {value!r}")
    if not MIN_IMAGE_SIDE <= value <= MAX_IMAGE_SIDE:
        raise OptionRangeError(f"dataset '{name}': {option}={value} is out of range; allowed: "
                               f"{MIN_IMAGE_SIDE} to {MAX_IMAGE_SIDE} pixels")
    return value


def check_spec(spec: DatasetSpec) -> None:
    """Spec options checked before anything is read (a loader may resize while it reads)."""
    _positive(spec.crop, "crop", spec.name)
    _positive(spec.resize, "resize", spec.name)


def check_image_bytes(name: str, count: int, channels: int, height: int, width: int) -> None:
    """Refuse a set of images whose float32 copy would exceed the documented maximum."""
    check_size(f"dataset '{name}' at {count}×{channels}×{height}×{width}", count * channels * height * width,
               MAX_DATA_BYTES // 4, "float32 values")


def apply_spec_transforms(ds: Dataset, spec: DatasetSpec) -> Dataset:
    """Centre-crop to `spec.crop`, resize to `spec.resize`, force `spec.channels`."""
    crop = _positive(spec.crop, "crop", spec.name)
    size = _positive(spec.resize, "resize", spec.name)
    if spec.channels is not None and spec.channels not in (1, 3):
        raise GradleakError(
            f"dataset '{spec.name}': channels must be 1 or 3, got {spec.channels!r}")
    kind = modality_of(ds.modality)
    kind.check_dataset_options(spec.name, {"seq_len": spec.seq_len})
    if crop is None and size is None and spec.channels is None:
        return ds
    kind.check_dataset_options(spec.name, {"crop": crop, "resize": size, "channels": spec.channels})
    x = ds.inputs
    if crop is not None:
        h, w = x.shape[-2:]
        if crop > min(h, w):
            raise GradleakError(f"dataset '{spec.name}': crop={crop} is larger than its "
                                f"{h}x{w} images")
        x = center_crop(x, crop)
    if size is not None:
        check_image_bytes(spec.name, x.shape[0], x.shape[1], size, size)
        x = resize_images(x, size)
    if spec.channels is not None:
        x = to_channels(x, spec.channels)
    return dataclasses.replace(ds, inputs=x.contiguous())
