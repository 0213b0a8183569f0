"""Label recovery from the classifier head's gradient, shared by all attacks.

Batch of 1 (iDLG, Zhao et al. 2020): with softmax cross-entropy the head's bias
gradient is p − onehot(y), negative only at the true class; without a bias, the
true class's weight-gradient row −(1−p_y)h points against every other row p_c h.

Larger batches (label counts, in the spirit of Wainakh et al.'s estimators): the
mean-loss bias gradient is g_c = p̄_c − n_c / B, so n_c = B (p̄_c − g_c); the
weight-based estimator uses row sums, g_c·1 ≈ (p̄_c − n_c/B) h̄ with h̄ the mean
feature sum. p̄ and h̄ are estimated by running the server's own model on
dummy inputs (or on prior data when the threat model grants it). Counts are
rounded by largest remainder so they sum to B, and every class whose gradient
is negative is counted at least once.
"""
from __future__ import annotations

from typing import Literal

import torch

from ..models import last_linear
from ..threat import Observation

Method = Literal["auto", "bias", "weight"]


def recover_labels(obs: Observation, method: Method = "auto", generator: torch.Generator | None = None
                   ) -> torch.Tensor:
    """Labels of the observed batch: granted ones if the threat model allows,
    else recovered from the update. Returns a sorted multiset for B > 1."""
    if obs.knows("labels"):
        return obs.get("labels").clone()
    batch = obs.batch_size
    head_name, head = last_linear(obs.model)
    grads = obs.update.as_gradient()
    g_weight = grads.get(f"{head_name}.weight")
    g_bias = grads.get(f"{head_name}.bias")
    use_bias = g_bias is not None and method in ("auto", "bias")
    if g_weight is None and not use_bias:
        raise ValueError("the update has no classifier-head gradient to recover labels from")
    if batch == 1:
        if use_bias:
            return g_bias.argmin().view(1).long()
        return _odd_row_out(g_weight).view(1)
    mean_probs, mean_feature_sum = _dummy_statistics(obs, head, generator)
    if use_bias:
        negative = g_bias < 0
        raw = batch * (mean_probs - g_bias)
    else:
        row_sums = g_weight.sum(1)
        negative = row_sums < 0
        raw = batch * (mean_probs - row_sums / max(mean_feature_sum, 1e-8))
    counts = _round_counts(raw.clamp(min=0), batch, negative)
    return torch.repeat_interleave(torch.arange(len(counts)), counts)


def _odd_row_out(g_weight: torch.Tensor) -> torch.Tensor:
    rows = torch.nn.functional.normalize(g_weight.flatten(1), dim=1)
    sim = rows @ rows.T
    sim.fill_diagonal_(0)
    return sim.sum(1).argmin()


@torch.no_grad()
def _dummy_statistics(obs: Observation, head: torch.nn.Module, generator: torch.Generator | None
                      ) -> tuple[torch.Tensor, float]:
    if obs.knows("prior_data"):
        x = obs.get("prior_data").inputs[:64]
    else:
        g = generator or torch.Generator().manual_seed(0)
        x = torch.rand((64, *obs.input_shape), generator=g)
        if obs.modality == "tabular":
            x = torch.randn((64, *obs.input_shape), generator=g)
    features: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda _m, inp, _o: features.append(inp[0]))
    model = obs.model
    was_training = model.training
    model.eval()
    try:
        probs = torch.softmax(model(x), -1).mean(0)
    finally:
        handle.remove()
        model.train(was_training)
    return probs, float(features[0].sum(1).mean())


def _round_counts(raw: torch.Tensor, total: int, must_have: torch.Tensor) -> torch.Tensor:
    raw = raw.double()
    if raw.sum() <= 0:
        raw = must_have.double()
    if raw.sum() <= 0:
        raw = torch.ones_like(raw)
    scaled = raw * total / raw.sum()
    counts = scaled.floor().long()
    # every class with a negative gradient entry is present at least once
    counts = torch.maximum(counts, must_have.long().clamp(max=1) * (must_have.sum() <= total).long())
    while counts.sum() < total:
        counts[(scaled - counts).argmax()] += 1
    while counts.sum() > total:
        candidates = torch.where(counts > must_have.long(), scaled - counts, torch.full_like(scaled, 1e9))
        counts[candidates.argmin()] -= 1
    return counts
