"""Soteria (Sun et al., CVPR 2021): perturb the data representation at the
defended FC layer (the classifier head's input).

For every feature r_f of that layer it measures ||∂r_f/∂x|| / |r_f| (summed
over the batch) — how much the input must move per unit of the feature — and
prunes the fraction `rate` of features with the smallest value (those whose
removal most changes the reconstructable input) from the head's weight
gradient. Applied to every local step's gradient, as in the reference code.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import functional_call, jacrev

from ..models import last_linear
from ..options import check
from .base import Defense, DefenseContext


@dataclass
class SoteriaOptions:
    rate: float = 0.8  # pruning rate of the defended layer's features (80% in the paper)

    def __post_init__(self):
        check(0 <= self.rate <= 1, f"defense 'soteria': rate must be in [0, 1], got {self.rate}")


class Soteria(Defense):
    """Prunes the head-input features most revealing of the input from the head's gradient."""

    name = "soteria"
    Options = SoteriaOptions
    places = ("gradient",)

    def feature_mask(self, model, params, buffers, x: torch.Tensor) -> torch.Tensor:
        """1 for the features kept, 0 for the `rate` fraction pruned."""
        head_name, head = last_linear(model)
        detached = {n: p.detach() for n, p in params.items()}

        def features(inputs: torch.Tensor) -> torch.Tensor:
            captured = {}
            handle = head.register_forward_pre_hook(lambda _m, args: captured.setdefault("r", args[0]))
            try:
                functional_call(model, (detached, buffers), (inputs,))
            finally:
                handle.remove()
            return captured["r"]

        r = features(x).detach()  # (B, F)
        jac = jacrev(lambda inputs: features(inputs).sum(0))(x)  # (F, B, *input)
        sensitivity = jac.flatten(2).norm(dim=2).T  # (B, F): ||∂r_f/∂x_b||
        score = (sensitivity / r.abs().clamp_min(1e-12)).sum(0)
        n = score.numel()
        pruned = int(round(self.options.rate * n))
        mask = torch.ones(n)
        if pruned:
            mask[score.topk(pruned, largest=False).indices] = 0
        return mask

    def wrap_step_gradient(self, inner, ctx: DefenseContext):
        def defended(model, params, buffers, x, y, create_graph):
            grads = inner(model, params, buffers, x, y, create_graph)
            head_name, _ = last_linear(model)
            key = f"{head_name}.weight"
            if key in grads:
                mask = self.feature_mask(model, params, buffers, x).to(grads[key])
                grads = {**grads, key: grads[key] * mask}
            return grads

        return defended
