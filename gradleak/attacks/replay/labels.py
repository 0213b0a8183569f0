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

Where the model's softmax is confident and input-dependent (the DLG LeNet's uniform init), the
dummy inputs' mean softmax is a poor stand-in for the batch's own and the counts can be one
label off: a class the batch holds can have a positive head-bias entry. `label_candidates`
lists the estimate and every multiset one label away from it that keeps one example of each
negative-gradient class, for an attack to choose among by its own matching (`fedavg`'s label
trials).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from ...fl.local import optimizer_step
from ...models import last_linear
from ...options import ComponentSpec
from ...threat import Observation

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
    trajectory = _sgd_step_weights(obs)
    if trajectory is not None:
        counts = _trajectory_counts(obs, head_name, head, generator, use_bias, trajectory)
        return torch.repeat_interleave(torch.arange(len(counts)), counts)
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


def label_candidates(obs: Observation, generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """The count estimate (`recover_labels` "auto") first, then every multiset that swaps one
    of its labels for another class, except the one example that each class with a negative
    head-gradient entry certainly has (sorted label tensors). Only the labels themselves where
    the threat model grants them or the batch is one example (whose label is exact)."""
    estimate = recover_labels(obs, "auto", generator)
    if obs.knows("labels") or obs.batch_size == 1:
        return [estimate]
    head_name, _ = last_linear(obs.model)
    grads = obs.update.as_gradient()
    g_bias = grads.get(f"{head_name}.bias")
    entries = g_bias if g_bias is not None else grads[f"{head_name}.weight"].sum(1)
    # a FedAvg delta's head entries have the sign of Σ_s c_s g_s, c_s > 0 for SGD
    loose = estimate.tolist()
    for c in (entries < 0).nonzero().flatten().tolist():
        if c in loose:
            loose.remove(c)
    out = [tuple(estimate.tolist())]
    for dropped in sorted(set(loose)):
        rest = list(estimate.tolist())
        rest.remove(dropped)
        for added in range(obs.num_classes):
            swapped = tuple(sorted(rest + [added]))
            if swapped not in out:
                out.append(swapped)
    return [torch.tensor(m, dtype=torch.long) for m in out]


def _odd_row_out(g_weight: torch.Tensor) -> torch.Tensor:
    rows = torch.nn.functional.normalize(g_weight.flatten(1), dim=1)
    sim = rows @ rows.T
    sim.fill_diagonal_(0)
    return sim.sum(1).argmin()


def _sgd_step_weights(obs: Observation) -> list[float] | None:
    """For a FedAvg delta of SGD (with momentum, dampening, Nesterov) over several steps: how
    much each step's gradient moved the weights in all (c_s, in units of lr; weight decay
    aside), so that delta / lr = Σ_s c_s g_s. None where that does not hold (FedSGD, Adam)."""
    if obs.update.kind != "delta" or not obs.knows("local_training"):
        return None
    training = obs.training
    if training.optimizer_name != "sgd":
        return None
    steps = training.num_steps(obs.batch_size)
    if steps < 2:
        return None
    options = training.optimizer_options
    unit = dataclasses.replace(training, lr=1.0, optimizer=str(ComponentSpec("sgd", {
        "momentum": options.momentum, "dampening": options.dampening, "nesterov": options.nesterov})))
    # The client's own optimizer, by linearity run once over a parameter with one coordinate
    # per step whose gradient at step s is the unit vector e_s: coordinate s ends displaced by c_s.
    params = {"c": torch.zeros(steps, dtype=torch.float64)}
    state: dict[str, dict[str, torch.Tensor]] = {}
    for s in range(steps):
        params = optimizer_step(unit, s, params, {"c": torch.eye(steps, dtype=torch.float64)[s]}, state)
    return (-params["c"]).tolist()


@torch.no_grad()
def _trajectory_counts(obs: Observation, head_name: str, head: torch.nn.Module, generator: torch.Generator | None,
                       use_bias: bool, weights: list[float]) -> torch.Tensor:
    """Label counts from a multi-step SGD delta (Dimitrov et al.'s extension of the count
    estimators to FedAvg): the mean softmax (and feature sum) of dummy inputs is taken at
    every step of the local training, on weights interpolated along the update in
    proportion to how far the client had moved by then, and the step gradients' head entries
    Σ_s c_s (p̄_s − n_s/B_s) are solved for the counts, each example seen in a step in
    proportion to that step's share of the batch."""
    batch, training = obs.batch_size, obs.training
    delta = obs.update.tensors
    params = {n: p.detach() for n, p in obs.model.named_parameters()}
    x = _dummy_inputs(obs, generator)
    total = sum(weights)
    probs_sum = torch.zeros(())
    feature_weighted = torch.zeros(())
    done = 0.0
    for c in weights:
        fraction = done / total
        moved = {n: p - fraction * delta[n] if n in delta else p for n, p in params.items()}
        probs, feature_sum = _head_statistics(obs.model, head, x, moved)
        probs_sum = probs_sum + c * probs * (feature_sum if not use_bias else 1.0)
        feature_weighted = feature_weighted + c * (feature_sum if not use_bias else 1.0)
        done += c
    lr = training.lr
    if use_bias:
        observed = delta[f"{head_name}.bias"] / lr
    else:
        observed = delta[f"{head_name}.weight"].sum(1) / lr
    negative = observed < 0
    raw = batch * (probs_sum - observed) / feature_weighted
    return _round_counts(raw.clamp(min=0), batch, negative)


def _dummy_inputs(obs: Observation, generator: torch.Generator | None) -> torch.Tensor:
    if obs.knows("prior_data"):
        return obs.get("prior_data").inputs[:64]
    return obs.kind.probe_inputs(64, obs.input_shape, generator or torch.Generator().manual_seed(0))


def _dummy_statistics(obs: Observation, head: torch.nn.Module, generator: torch.Generator | None
                      ) -> tuple[torch.Tensor, float]:
    return _head_statistics(obs.model, head, _dummy_inputs(obs, generator))


@torch.no_grad()
def _head_statistics(model: torch.nn.Module, head: torch.nn.Module, x: torch.Tensor,
                     params: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, float]:
    """The mean softmax of `x` and the mean feature sum entering the head, with the model in
    eval mode, at its own weights or at `params`."""
    from torch.func import functional_call

    features: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda _m, inp, _o: features.append(inp[0]))
    was_training = model.training
    model.eval()
    try:
        logits = model(x) if params is None else functional_call(model, params, (x,))
        probs = torch.softmax(logits, -1).mean(0)
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
