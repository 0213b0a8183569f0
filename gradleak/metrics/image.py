"""Per-example MSE, PSNR and SSIM for inputs in [0, 1]."""
from __future__ import annotations

import math
import warnings

import torch
from pytorch_msssim.ssim import _fspecial_gauss_1d
from pytorch_msssim.ssim import _ssim as _ssim_per_channel

from ..errors import GradleakError


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
    """SSIM per image, shape (N,) for images (N, C, H, W) (Gaussian window 11, σ 1.5; the
    window shrinks to fit images smaller than 11 px, e.g. 8×8 digits). A side of 1 or 2 px
    (a strip of pixels) is not smoothed: the window runs along the other side only."""
    if x.dim() != 4 or x.shape != y.shape:
        raise GradleakError(f"SSIM needs two image batches of one shape (N, C, H, W), got {tuple(x.shape)} "
                            f"and {tuple(y.shape)}")
    sides = [side for side in x.shape[-2:] if side >= 3] or [1]
    side = min(sides)
    win = min(11, side if side % 2 == 1 else side - 1)
    window = _fspecial_gauss_1d(win, 1.5).repeat(x.shape[1], 1, 1, 1).double()
    with warnings.catch_warnings():  # pytorch_msssim says when it skips a side narrower than the window
        warnings.simplefilter("ignore")
        # its internal function: the public one squeezes away sides of 1 px and then refuses the tensor
        per_channel, _ = _ssim_per_channel(x.double(), y.double(), data_range=data_range, win=window,
                                           size_average=False, K=(0.01, 0.03))
    return per_channel.mean(1).float()
