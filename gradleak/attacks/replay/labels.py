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

Which classes the batch holds is read more reliably than how many of each (the support rule,
`present_classes`): where the features entering the head are non-negative (after a sigmoid or
ReLU), an absent class's head-gradient row is p_c·h ≥ 0 in every coordinate, bias included, and
stays so summed over the local steps of SGD or Adam with positive coefficients; a class the
batch holds usually leaves a negative entry −(1 − p_y)·h_i where its example's features
dominate. On the DLG LeNet at lr 0.1 (batch 4, 2 epochs of 2) the rows split at −0.3 against ≥ 0
of the head's largest entry on 8 of 8 seeds, where the bias sign alone missed a present class on
7 of them (docs/client-training.md). Every class the rows show is then counted at least once;
a class whose rows show nothing is not ruled out (the model may already predict its examples).

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
    return _recover(obs, method, generator, present_classes(obs, generator))


def _recover(obs: Observation, method: Method, generator: torch.Generator | None, support: torch.Tensor | None
             ) -> torch.Tensor:
    """`recover_labels` with the support rule's classes (`present_classes`) already read."""
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
        counts = _trajectory_counts(obs, head_name, head, generator, use_bias, trajectory, support)
        return torch.repeat_interleave(torch.arange(len(counts)), counts)
    mean_probs, mean_feature_sum = _dummy_statistics(obs, head, generator)
    if use_bias:
        negative = g_bias < 0
        raw = batch * (mean_probs - g_bias)
    else:
        row_sums = g_weight.sum(1)
        negative = row_sums < 0
        raw = batch * (mean_probs - row_sums / max(mean_feature_sum, 1e-8))
    counts = _round_counts(raw.clamp(min=0), batch, negative, support)
    return torch.repeat_interleave(torch.arange(len(counts)), counts)


def label_candidates(obs: Observation, generator: torch.Generator | None = None, within_support: bool = False
                     ) -> list[torch.Tensor]:
    """The count estimate (`recover_labels` "auto") first, then every multiset that swaps one
    of its labels for another class, except the one example that each class with a negative
    head-gradient entry certainly has (sorted label tensors). `within_support`: only the swaps
    that hold nothing but the classes the head's rows show present (`present_classes`), none
    where that rule does not apply. Only the labels themselves where the threat model grants
    them or the batch is one example (whose label is exact)."""
    present = present_classes(obs, generator)
    estimate = _recover(obs, "auto", generator, present)
    if obs.knows("labels") or obs.batch_size == 1:
        return [estimate]
    head_name, _ = last_linear(obs.model)
    grads = obs.update.as_gradient()
    g_bias = grads.get(f"{head_name}.bias")
    entries = g_bias if g_bias is not None else grads[f"{head_name}.weight"].sum(1)
    # a FedAvg delta's head entries have the sign of Σ_s c_s g_s, c_s > 0 for SGD
    if within_support and present is None:
        return [estimate]
    certain = entries < 0 if present is None else (entries < 0) | present
    loose = _without_one_each(estimate.tolist(), certain)
    added = range(obs.num_classes) if not within_support else present.nonzero().flatten().tolist()
    out = [tuple(estimate.tolist())]
    for dropped in sorted(set(loose)):
        rest = list(estimate.tolist())
        rest.remove(dropped)
        for label in added:
            swapped = tuple(sorted(rest + [label]))
            if swapped not in out and (not within_support or all(bool(present[c]) for c in swapped)):
                out.append(swapped)
    return [torch.tensor(m, dtype=torch.long) for m in out]


def present_classes(obs: Observation, generator: torch.Generator | None = None,
                    tolerance: float = 1e-3) -> torch.Tensor | None:
    """The support rule: a boolean mask of classes the batch certainly holds, read from which rows of
    the head's update (weight and bias, gradient orientation) have an entry below −tolerance ×
    the head's largest entry; None where the rule does not apply. It applies where every
    feature entering the head is non-negative (checked on the modality's probe inputs and on
    wide Gaussian ones), the loss is plain cross-entropy, and no weight decay adds −λw to an
    absent row; and it is used only where it is consistent (at least one class absent, and no
    more classes present than examples), so that noise added to the update, which makes every
    row negative somewhere, turns it off rather than forcing every class in."""
    if obs.batch_size < 2 or obs.knows("labels"):
        return None
    if obs.knows("local_training"):
        training = obs.training
        if training.label_smoothing > 0 or training.optimizer_options.weight_decay > 0:
            return None
    head_name, head = last_linear(obs.model)
    grads = obs.update.as_gradient()
    rows = grads.get(f"{head_name}.weight")
    if rows is None or rows.dim() != 2:
        return None
    if f"{head_name}.bias" in grads:
        rows = torch.cat([rows, grads[f"{head_name}.bias"][:, None]], 1)
    scale = float(rows.abs().max())
    if not scale > 0 or not _non_negative_features(obs, head, generator):
        return None
    present = rows.min(1).values < -tolerance * scale
    if not 0 < int(present.sum()) <= obs.batch_size or bool(present.all()):
        return None
    return present


def _non_negative_features(obs: Observation, head: torch.nn.Module, generator: torch.Generator | None) -> bool:
    inputs = [_dummy_inputs(obs, generator)]
    if inputs[0].is_floating_point():
        wide = torch.Generator().manual_seed(1)
        inputs.append(4 * torch.randn(inputs[0].shape, generator=wide, dtype=inputs[0].dtype))
    features: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda _m, inp, _o: features.append(inp[0].detach()))
    was_training = obs.model.training
    obs.model.eval()
    try:
        with torch.no_grad():
            for x in inputs:
                obs.model(x)
    finally:
        handle.remove()
        obs.model.train(was_training)
    return all(bool((f >= 0).all()) for f in features)


def _without_one_each(labels: list[int], present: torch.Tensor) -> list[int]:
    rest = list(labels)
    for c in present.nonzero().flatten().tolist():
        if c in rest:
            rest.remove(c)
    return rest


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
                       use_bias: bool, weights: list[float], support: torch.Tensor | None = None) -> torch.Tensor:
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
    return _round_counts(raw.clamp(min=0), batch, negative, support)


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


def _round_counts(raw: torch.Tensor, total: int, must_have: torch.Tensor, support: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Counts summing to `total` by largest remainder, every class of `must_have` and of
    `support` (the classes the head's rows show present) at least once."""
    if support is not None:
        must_have = must_have | support
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
