"""DP-SGD (Abadi et al. 2016) inside local training: every local step clips each
example's gradient to L2 norm C, sums, adds N(0, σ²C²) and averages.

Per-example gradients come from torch.func (vmap over grad of functional_call);
(ε, δ) comes from Opacus's RDP accountant through `Defense.privacy`.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from ..errors import GradleakError
from ..fl.local import StepGradient, Tensors, batch_loss
from ..options import check
from .base import Defense, DefenseContext


@dataclass
class DPSGDOptions:
    clip: float = 1.0  # per-example L2 bound C
    sigma: float = 1.0  # noise multiplier: noise std is sigma * C

    def __post_init__(self):
        check(self.clip > 0 and math.isfinite(self.clip), f"defense DP: clip must be > 0, got {self.clip}")
        check(self.sigma >= 0 and math.isfinite(self.sigma), f"defense DP: sigma must be >= 0, got {self.sigma}")


def per_example_gradients(model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor,
                          y: torch.Tensor, label_smoothing: float = 0.0) -> Tensors:
    """{name: (B, *param.shape)}: the loss gradient of every example separately."""
    trainable = {n: p for n, p in params.items() if p.requires_grad}
    frozen = {n: p for n, p in params.items() if not p.requires_grad}

    def example_loss(p, xi, yi):
        logits = functional_call(model, ({**p, **frozen}, buffers), (xi.unsqueeze(0),))
        return batch_loss(logits, yi.unsqueeze(0), label_smoothing)

    try:
        return vmap(grad(example_loss), in_dims=(None, 0, 0), randomness="different")(trainable, x, y)
    except RuntimeError as exc:
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise GradleakError("per-example DP defenses need a model without batch norm "
                                "(per-example gradients are undefined under batch statistics)") from None
        raise exc


def clip_factors(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """g / max(1, ||g||/C) as a multiplier (eq. 17 of Yue et al.)."""
    return 1.0 / torch.clamp(norms / bound, min=1.0)


class DPSGD(Defense):
    """Per-example clipping of the whole gradient to C, Gaussian noise σC, every local step."""

    name = "dpsgd"
    strength = ("sigma", 1)
    Options = DPSGDOptions
    places = ("gradient",)

    def two_layer(self, view):
        # As wrap_step_gradient and Opacus: every example's gradient clipped to `clip`,
        # averaged, plus N(0, (sigma·clip/B)²) on every coordinate of the average.
        opts, batch = self.options, view.x.shape[0]

        def per_example_clipped(x_: torch.Tensor) -> torch.Tensor:
            grads = [view.gradient(x_, slice(i, i + 1)) for i in range(batch)]
            return sum(g * torch.clamp(opts.clip / g.norm(), max=1.0) for g in grads) / batch
        norms = [float(view.gradient(view.x, slice(i, i + 1)).norm()) for i in range(batch)]
        # Every example is scaled by its own factor; the least-clipped one bounds the error
        # from below, so the closed form uses the smallest factor.
        return view.result(per_example_clipped, noise=opts.sigma * opts.clip / batch, grad_norm=max(norms),
                           clip_factor=max(1.0, min(norms) / opts.clip))

    def clip_per_example(self, per_example: Tensors) -> Tensors:
        flat_norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_example.values()))
        factors = clip_factors(flat_norms, self.options.clip)
        return {n: g * factors.view(-1, *[1] * (g.dim() - 1)) for n, g in per_example.items()}

    def wrap_step_gradient(self, inner: StepGradient, ctx: DefenseContext) -> StepGradient:
        opt = self.options

        def noisy_gradient(model, params, buffers, x, y, create_graph):
            clipped = self.clip_per_example(per_example_gradients(model, params, buffers, x, y,
                                                                    ctx.label_smoothing))
            batch = x.shape[0]
            return {n: (g.sum(0) + opt.sigma * opt.clip * torch.randn(g.shape[1:], generator=ctx.generator)
                        .to(g)) / batch for n, g in clipped.items()}

        return noisy_gradient

    def noise_multiplier(self) -> float:
        """Noise std over the L2 sensitivity of one example's clipped gradient."""
        return self.options.sigma

    def privacy(self, *, sample_rate: float, steps: int, delta: float) -> float | None:
        if self.noise_multiplier() == 0:
            return math.inf
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis.rdp import get_privacy_spent

        # what RDPAccountant.get_epsilon computes for this one mechanism, from the shared per-step curve
        orders = tuple(RDPAccountant.DEFAULT_ALPHAS)
        with warnings.catch_warnings():
            # "optimal order is the smallest alpha": at weak noise ε is large and the bound at the
            # smallest order is still a valid (if loose) upper bound; the report prints ε itself
            warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
            epsilon, _ = get_privacy_spent(orders=list(orders), rdp=self._step_rdp(sample_rate, orders) * int(steps),
                                           delta=delta)
        return float(epsilon)

    def rdp(self, *, sample_rate: float, steps: int, orders: list[float]) -> list[float] | None:
        if self.noise_multiplier() == 0:
            return [math.inf] * len(orders)
        return [float(v) for v in self._step_rdp(sample_rate, tuple(orders)) * int(steps)]

    def _step_rdp(self, sample_rate: float, orders: tuple[float, ...]):
        """Opacus's `compute_rdp` of one step at each order, kept per (sample rate, orders):
        `compute_rdp` multiplies this curve by the steps, so ε and the RDP curve of a client
        (`privacy`, `rdp`: a utility run asks both for every client) share one computation,
        the costly part of accounting (seconds per run for 50 clients)."""
        from opacus.accountants.analysis.rdp import compute_rdp

        kept = self.__dict__.setdefault("_step_rdp_kept", {})
        key = (min(1.0, sample_rate), orders)
        if key not in kept:
            kept[key] = compute_rdp(q=key[0], noise_multiplier=self.noise_multiplier(), steps=1, orders=list(orders))
        return kept[key]
