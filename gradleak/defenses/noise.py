"""Additive Gaussian noise on the update (Liu et al. "gradient noise", Wei et al. Tab. 8).

Two ways to set the strength: an absolute std `sigma` per coordinate, or an SNR
in dB relative to the update it is added to (Yue et al. treats the clipped
gradient as the signal): noise power = signal power / 10^(snr_db/10), both per
coordinate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import GradleakError
from ..fl.update import Update
from ..options import check
from .base import Defense, DefenseContext


@dataclass
class NoiseOptions:
    sigma: float = 1e-2  # absolute std of the noise on every coordinate
    snr_db: float | None = None  # if set, overrides sigma: noise scaled to this SNR (dB) of the update

    def __post_init__(self):
        check(self.sigma >= 0 and math.isfinite(self.sigma),
              f"defense 'noise': sigma must be >= 0, got {self.sigma}")
        check(self.snr_db is None or math.isfinite(self.snr_db),
              f"defense 'noise': snr_db must be a finite number, got {self.snr_db}")


def noise_scale(update: Update, sigma: float, snr_db: float | None) -> float:
    """Per-coordinate std: `sigma`, or the one giving `snr_db` against the update's RMS."""
    if snr_db is None:
        return sigma
    flat = update.flat()
    signal_power = float(flat.pow(2).mean())
    return math.sqrt(signal_power / 10 ** (snr_db / 10))


class GaussianNoise(Defense):
    """Gaussian noise N(0, sigma²) added to every update coordinate."""

    name = "noise"
    strength = ("sigma", 1)
    Options = NoiseOptions

    def strength_axis(self) -> tuple[str, int] | None:
        # noise set by its SNR scales with the update: sigma no longer orders it
        return None if self.options.snr_db is not None else self.strength

    def check_two_layer(self) -> None:
        if self.options.snr_db is not None:
            raise GradleakError("defense 'noise': the two-layer analysis takes an absolute sigma, not snr_db")

    def two_layer(self, view):
        return view.result(view.plain, noise=self.options.sigma)

    def sample(self, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
        """Unit-scale noise (std 1 for Gaussian)."""
        return torch.randn(shape, generator=generator)

    def transform_update(self, update, ctx: DefenseContext):
        scale = noise_scale(update, self.options.sigma, self.options.snr_db)
        return update.map(lambda _, t: t + scale * self.sample(t.shape, ctx.generator).to(t))
