"""Per-example MSE, PSNR and SSIM for inputs in [0, 1]."""
from __future__ import annotations

import math

import torch
from pytorch_msssim import ssim as _ssim


def mse(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error per example, shape (N,)."""
    return (x - y).pow(2).flatten(1).mean(1)


# MSE floor: an exact copy scores 100 dB instead of infinity.
PSNR_MSE_FLOOR = 1e-10


def psnr(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB per example (capped at 100 dB for exact copies)."""
    err = mse(x, y).clamp(min=PSNR_MSE_FLOOR)
    return 10 * torch.log10(data_range ** 2 / err)


def psnr_from_mse(value: float, data_range: float = 1.0) -> float:
    """PSNR in dB of a mean squared error, with the same 100 dB cap as `psnr`."""
    return 10 * math.log10(data_range ** 2 / max(float(value), PSNR_MSE_FLOOR))


def ssim(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """SSIM per image (Gaussian window 11, σ 1.5; the window shrinks to fit images
    smaller than 11 px, e.g. 8×8 digits)."""
    side = min(x.shape[-2:])
    win = min(11, side if side % 2 == 1 else side - 1)
    return _ssim(x.double(), y.double(), data_range=data_range, size_average=False,
                 win_size=win).float()
