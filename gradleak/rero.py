"""Reconstruction robustness (ReRo) from Rényi differential privacy: the largest probability
that any reconstruction attack succeeds against a DP training, given how often a guess without
the update would (Balle, Cherubin and Hayes, IEEE S&P 2022; Hayes, Mahloujifar and Balle,
NeurIPS 2023, tighten it with the full trade-off curve). The report puts it beside the grade a
DP defense measured (docs/verdicts.md)."""
from __future__ import annotations

import math

# Rényi orders the reconstruction-robustness bound is minimised over (Opacus's default grid).
RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def reconstruction_bound(rdp: list[tuple[float, float]], baseline: float) -> float:
    """The largest probability that any reconstruction attack succeeds against a mechanism with
    Rényi DP curve `rdp` ((order α, ε_α) pairs), where a guess without the update succeeds with
    probability `baseline` (κ): min over α of (κ·e^ε_α)^((α−1)/α), at most 1 (Balle, Cherubin
    and Hayes, IEEE S&P 2022, reconstruction robustness from RDP). It never falls below κ."""
    if not 0 < baseline <= 1:
        raise ValueError(f"baseline must be in (0, 1], got {baseline}")
    best = 1.0
    for order, epsilon in rdp:
        if order > 1 and math.isfinite(epsilon):
            exponent = (order - 1) / order * (math.log(baseline) + epsilon)
            if exponent < 0:  # at or above 0 the order bounds nothing (and e^exponent may overflow)
                best = min(best, math.exp(exponent))
    return max(best, baseline)
