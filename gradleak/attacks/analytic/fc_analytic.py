"""Analytic inversion of the first fully connected layer (Phong et al. 2017; Fan et al. 2020).

x = ∂L/∂W[c,:] / ∂L/∂b[c]. For one sample every row with a non-zero bias gradient gives x
exactly; the attack returns their |∂L/∂b|-weighted least-squares combination. For a batch, a row
whose unit fires for a single sample still gives that sample; the attack returns the B candidates
most rows agree on. When the first FC layer is the classifier head (logistic regression), row c
gives a weighted mean of the samples of class c (the "class sum" case).
Needs a model whose first layer is nn.Linear on the flattened input with a bias (e.g. mlp).
Works on FedSGD gradients and on one-step FedAvg deltas (the ratio is scale-free).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...options import check
from ...solvers.fc import distinct_consensus, first_linear, layer_gradients, row_ratios
from ...threat import Observation
from ..base import Attack, AttackContext, Reconstruction, check_result
from ..replay.labels import recover_labels


@dataclass
class FCAnalyticOptions:
    rel_threshold: float = 1e-4  # ignore rows whose |∂L/∂b| is below this fraction of the largest
    tolerance: float = 0.02  # RMS distance under which two row candidates count as the same sample

    def __post_init__(self):
        check(0 <= self.rel_threshold < 1, "attack 'fc-analytic': rel_threshold must be in [0, 1)")
        check(self.tolerance > 0, "attack 'fc-analytic': tolerance must be > 0")


def invert_first_layer(obs: Observation, batch: int, opt: FCAnalyticOptions) -> torch.Tensor:
    """(n ≤ batch, *input_shape) analytic reconstructions from the first FC layer of obs.model."""
    name, _ = first_linear(obs.model, obs.input_shape)
    g_weight, g_bias = layer_gradients(obs.update.as_gradient(), name)
    candidates, weights = row_ratios(g_weight, g_bias, opt.rel_threshold)
    if batch == 1:
        # every row is the same sample: weighted least squares over rows
        w = weights / weights.sum()
        x = (candidates * w[:, None]).sum(0, keepdim=True)
    else:
        x = distinct_consensus(candidates, weights, batch, opt.tolerance)
    return x.float().reshape(-1, *obs.input_shape)


class FCAnalytic(Attack):
    """Analytic inversion of a first fully connected layer: x = ∂L/∂W[c,:] / ∂L/∂b[c]."""

    name = "fc-analytic"
    Options = FCAnalyticOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels"})

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: first_linear(model, input_shape)))

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        x = invert_first_layer(obs, obs.batch_size, self.options)
        x = obs.kind.clamp(x)
        labels = recover_labels(obs, "auto", ctx.generator(17))
        return Reconstruction(inputs=x, labels=labels, extras={"candidates": int(x.shape[0])})
