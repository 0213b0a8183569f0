"""Image priors shared by every reconstruction that optimises inputs: the
gradient-matching attacks (through `attacks.engine.engine`) and the feature inversion
of `solvers.features`. Plain tensor functions, one definition each."""
from __future__ import annotations

import torch


def total_variation(x: torch.Tensor, per_image: bool = False) -> torch.Tensor:
    """Anisotropic total variation: the mean absolute difference between
    horizontal and between vertical neighbours, summed. For image batches
    (B, C, H, W); anything else has none (zero). `per_image`: one value per row
    (B,) instead of the batch mean."""
    if x.dim() < 4:
        return x.new_zeros(x.shape[0]) if per_image else x.new_zeros(())
    dims = (1, 2, 3) if per_image else None
    dx = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs()
    dy = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs()
    if dims is None:
        return dx.mean() + dy.mean()
    return dx.mean(dims) + dy.mean(dims)


def batch_statistics(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (biased) variance of a batch-norm layer's input, as the
    layer computes them in training mode."""
    dims = [0] + list(range(2, h.dim()))
    return h.mean(dims), h.var(dims, unbiased=False)


def bn_statistics_distance(inputs: list[torch.Tensor],
                           target: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Σ_l ‖μ_l(x̂) − μ_l‖ + ‖σ²_l(x̂) − σ²_l‖ over batch-norm layers: the BN prior of
    GradInversion (Yin et al.), with the target statistics of the client's batch."""
    total = inputs[0].new_zeros(())
    for h, (mean, var) in zip(inputs, target):
        mu, sigma2 = batch_statistics(h)
        total = total + (mu - mean.to(h)).norm() + (sigma2 - var.to(h)).norm()
    return total
