"""Shared machinery of gradient-matching attacks.

`UpdateSimulator` recomputes, differentiably, what the client would have sent
for candidate data — the FedSGD gradient, or the τ-step FedAvg delta unrolled
with the same `fl.local.local_update` the client ran. Distances and the
registration of restarts live here; the optimisation loop is `engine`.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Literal

import torch
from scipy.optimize import linear_sum_assignment
from torch.autograd.function import once_differentiable

from ...fl.local import local_update, model_state
from ...fl.training import TrainingSpec
from ...threat import Observation
from . import factored
from .double_backward import make_twice_differentiable
from .finite_difference import DifferencedGradient, has_convolutions, supports

Tensors = dict[str, torch.Tensor]
# how a matching iteration differentiates the simulated gradient: autograd's exact
# double backward, the frozen-kink finite difference of `finite_difference`, or
# "auto": the difference where it applies and pays — models with convolutions
# (1.8–2.2× a training step instead of 2.5–3.4×); an MLP keeps the exact path,
# which for all-linear models runs on the gradient's factors (`factored`, 2.0×)
SecondOrder = Literal["exact", "difference", "auto"]
Distance = Literal["l2", "cosine", "l1", "weighted-cosine", "layer-cosine"]


class UpdateSimulator:
    """Candidate data → the update the client would send (differentiable)."""

    def __init__(self, obs: Observation, device: torch.device | str = "cpu", *,
                 cheap_double_backward: bool = True, second_order: SecondOrder = "exact",
                 steps: list[tuple[int, ...]] | None = None):
        self.obs = obs
        # the candidate rows of every local step, when an attack lays its candidates out
        # otherwise than one row per example (`local_update`'s `steps`; the fedavg attack)
        self.steps = steps
        # The declared local training when revealed (a FedAvg delta cannot be replayed
        # without it: `obs.training` refuses); otherwise a FedSGD gradient is one plain
        # step at the update's learning rate.
        if obs.update.kind == "delta" or obs.knows("local_training"):
            self.training = obs.training
        else:
            self.training = TrainingSpec(lr=obs.update.lr)
        differenced = (second_order != "exact" and steps is None and obs.update.kind == "gradient"
                       and self.training.is_fedsgd and self.training.plain_loss and supports(obs.model)
                       and (second_order == "difference" or has_convolutions(obs.model)))
        # A private copy whose conv / batch-norm layers get the cheaper second
        # derivative (`double_backward`), or whose kinks can be frozen for the
        # finite-difference one (`finite_difference`: FedSGD gradients of supported
        # layers only); the observed model is never touched.
        self.cheap_double_backward = cheap_double_backward and not differenced
        if differenced:
            self.model = copy.deepcopy(obs.model).to(device)
        elif cheap_double_backward:
            self.model = make_twice_differentiable(copy.deepcopy(obs.model).to(device))
        else:
            self.model = obs.model.to(device)
        self.params, self.buffers = model_state(self.model)
        self.params = {k: v.to(device) for k, v in self.params.items()}
        self.names = [n for n in obs.update.tensors if n in self.params]
        self.target = {n: obs.update.tensors[n].to(device) for n in self.names}
        self.sent = sent_entries(obs, self.target)
        self.differenced = (DifferencedGradient(self.model, self.names, self.training, obs.input_shape)
                            if differenced else None)
        # an all-linear model's gradient as its factors (`factored`): exact, and
        # its second derivative never touches parameter-sized tensors
        self.factored = (factored.FactoredGradient(self.model, self.names)
                         if (self.cheap_double_backward and steps is None and obs.update.kind == "gradient"
                             and self.training.is_fedsgd and self.training.plain_loss
                             and factored.supports(self.model, self.names, obs.input_shape))
                         else None)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> Mapping[str, torch.Tensor]:
        if self.differenced is not None:
            return self.as_sent(dict(zip(self.names, self.differenced(x, y))))
        if self.factored is not None:
            update = self.factored(x, y)
            return update if self.sent is None else self.as_sent(update)
        buffers = {k: v.clone() for k, v in self.buffers.items()}
        if self.cheap_double_backward and x.grad_fn is None:
            # a non-leaf handle lets the first layer skip its unused input
            # gradient while the update is simulated (see double_backward)
            x = x.view_as(x)
        _, update = local_update(self.model, self.params, buffers, x, y, self.training,
                                 create_graph=True, steps=self.steps)
        return self.as_sent(update)

    def as_sent(self, update: Tensors) -> Tensors:
        """The observed tensors of a simulated update, with the entries a
        sparsifying defense withheld zeroed (see `sent_entries`)."""
        if self.sent is None:
            return {n: update[n] for n in self.names}
        return {n: update[n] * self.sent[n] for n in self.names}


def sent_entries(obs: Observation, target: Tensors) -> Tensors | None:
    """0/1 masks of the entries a sparsifying defense (top-k, pruning, DGC, gradient
    dropout) let through, when the threat model reveals the defenses: comparing a
    dense candidate with a sparse observation would otherwise fit the zeros."""
    if not obs.knows("defenses"):
        return None
    if not any(getattr(d, "withholds_entries", False) for d in obs.get("defenses")):
        return None
    return {n: (t != 0).to(t.dtype) for n, t in target.items()}


def update_distance(candidate: Mapping[str, torch.Tensor], target: Tensors, kind: Distance = "cosine",
                    weights: dict[str, float] | None = None) -> torch.Tensor:
    """Distance between two updates, summed over named tensors.

    l2: Σ‖a−b‖² (DLG); l1; cosine: 1 − ⟨a,b⟩/(‖a‖‖b‖) over the whole
    concatenated update (Geiping et al.); weighted-cosine: the same with a
    per-tensor weight (Liu et al.'s norm-reweighting); layer-cosine: Σ over tensors
    of 1 − cos, so each tensor counts equally and scale-free (quantised targets,
    where one tensor's rounding error outweighs every image-dependent difference
    in a summed L2; docs/rog.md); all-zero target tensors are skipped.
    """
    names = list(target)
    w = weights or {}
    if isinstance(candidate, factored.FactoredUpdate):
        if kind in ("cosine", "weighted-cosine"):
            return factored.factored_cosine(candidate, target, w)
        candidate = {n: candidate[n] for n in names}
    if kind == "l2":
        return sum(w.get(n, 1.0) * (candidate[n] - target[n]).pow(2).sum() for n in names)
    if kind == "l1":
        return sum(w.get(n, 1.0) * (candidate[n] - target[n]).abs().sum() for n in names)
    if kind == "layer-cosine":
        total = 0.0
        for n in names:
            norm = target[n].norm()
            if float(norm) > 0:
                g = candidate[n]
                total = total + w.get(n, 1.0) * (1 - (g * target[n]).sum() / (g.norm() * norm + 1e-30))
        return total
    a_list, b_list = [candidate[n] for n in names], [target[n] for n in names]
    if sum(b.numel() for b in b_list) >= _FUSE_MIN and _fusable(a_list, b_list):
        weight = [float(w.get(n, 1.0)) for n in names] if w else None
        return _CosineDistance.apply(weight, b_list, *a_list)
    return _cosine_reference(a_list, b_list, [w.get(n, 1.0) for n in names])


def _cosine_reference(a_list: list[torch.Tensor], b_list: list[torch.Tensor],
                      weight: list[float]) -> torch.Tensor:
    """The cosine distance by plain autograd ops on one concatenated vector per side
    (weights folded in as √w): for tiny updates (fewer Python-level steps than
    `_CosineDistance`) and whenever `_CosineDistance` does not apply."""
    scale = [math.sqrt(v) for v in weight]
    a = _flat([t * s if s != 1.0 else t for t, s in zip(a_list, scale)])
    b = _flat([t * s if s != 1.0 else t for t, s in zip(b_list, scale)])
    return 1 - (a * b).sum() / (a.pow(2).sum().sqrt() * b.pow(2).sum().sqrt() + 1e-12)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


# Tensors below this many entries are concatenated (one reduction for all of
# them); larger ones are reduced in place, by BLAS dot products over chunks of at
# most `_CHUNK` entries: no copy of the update, and as accurate as a float32
# cascade sum `(a * b).sum()` (one single-precision BLAS dot over ~15 M entries
# is ~1e-5 off).
_SMALL, _CHUNK = 4096, 1 << 18
# Updates below this many entries take `_cosine_reference` (LeNet's 13 k: fewer
# Python-level steps); above, `_CosineDistance` (an MLP's 0.27 M onwards).
_FUSE_MIN = 1 << 16


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.reshape(-1), b.reshape(-1)
    if a.numel() <= _CHUNK:
        return torch.dot(a, b)
    return torch.stack([torch.dot(u, v) for u, v in zip(a.split(_CHUNK), b.split(_CHUNK))]).sum()


def _fusable(a_list: list[torch.Tensor], b_list: list[torch.Tensor]) -> bool:
    if not a_list or any(b.requires_grad for b in b_list):
        return False
    dtype, device = a_list[0].dtype, a_list[0].device
    return dtype.is_floating_point and all(
        t.dtype == dtype and t.device == device and t.shape == b.shape
        for a, b in zip(a_list, b_list) for t in (a, b))


class _CosineDistance(torch.autograd.Function):
    """1 − ⟨a,b⟩_w / (‖a‖_w ‖b‖_w + 1e-12) over all tensors of an update, with
    ⟨a,b⟩_w = Σᵢ wᵢ⟨aᵢ,bᵢ⟩: `_cosine_reference`'s value and gradient without
    concatenating the candidate update or building an autograd graph of
    parameter-sized temporaries. With D = ‖a‖‖b‖ + 1e-12 and incoming gradient
    ḡ, ∂/∂aᵢ = wᵢ(c_b·bᵢ + c_a·aᵢ), c_b = −ḡ/D, c_a = ḡ⟨a,b⟩‖b‖/(D²‖a‖)."""

    @staticmethod
    def forward(ctx, weight, b_list, *a_list):
        small = [i for i, b in enumerate(b_list) if b.numel() < _SMALL]
        big = [i for i, b in enumerate(b_list) if b.numel() >= _SMALL]
        dots, squares, target_squares = [], [], []
        a_small = wb_small = w_small = None
        if small:
            a_small = _flat([a_list[i] for i in small])
            b_small = _flat([b_list[i] for i in small])
            if weight is not None:
                w_small = _flat([torch.full((b_list[i].numel(),), weight[i], dtype=b_small.dtype,
                                            device=b_small.device) for i in small])
            wb_small = b_small if w_small is None else b_small * w_small
            dots.append((a_small * wb_small).sum())
            squares.append((a_small * a_small).sum() if w_small is None else (a_small * a_small * w_small).sum())
            target_squares.append((wb_small * b_small).sum())
        for i in big:
            d, s, t = _dot(a_list[i], b_list[i]), _dot(a_list[i], a_list[i]), _dot(b_list[i], b_list[i])
            if weight is not None and weight[i] != 1.0:
                d, s, t = d * weight[i], s * weight[i], t * weight[i]
            dots.append(d)
            squares.append(s)
            target_squares.append(t)
        dot = torch.stack(dots).sum()
        norm_a, norm_b = torch.stack(squares).sum().sqrt(), torch.stack(target_squares).sum().sqrt()
        denom = norm_a * norm_b + 1e-12
        ctx.save_for_backward(*a_list)
        ctx.weight, ctx.b_list, ctx.small, ctx.big = weight, b_list, small, big
        ctx.a_small, ctx.wb_small, ctx.w_small = a_small, wb_small, w_small
        ctx.coefficients = (dot, norm_a, norm_b, denom)
        return 1 - dot / denom

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        a_list, weight, b_list = ctx.saved_tensors, ctx.weight, ctx.b_list
        dot, norm_a, norm_b, denom = ctx.coefficients
        c_b = -grad / denom
        c_a = grad * dot * norm_b / (denom * denom * norm_a)
        grads: list[torch.Tensor | None] = [None] * len(a_list)
        if ctx.small:
            a_small = ctx.a_small if ctx.w_small is None else ctx.a_small * ctx.w_small
            g_small = torch.mul(ctx.wb_small, c_b).addcmul_(a_small, c_a)
            for i, part in zip(ctx.small, g_small.split([a_list[i].numel() for i in ctx.small])):
                grads[i] = part.view(a_list[i].shape)
        for i in ctx.big:
            scale = 1.0 if weight is None else weight[i]
            grads[i] = torch.mul(b_list[i], c_b * scale).addcmul_(a_list[i], c_a * scale)
        return (None, None, *grads)


@torch.no_grad()
def registered_mean(group: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """Mean of several reconstructions of one batch (restarts) after registering
    each to the first: rows are permuted (only among rows of the same label) to
    best match the reference. Pixels the update barely constrains carry
    init-dependent noise, which averaging independent restarts reduces."""
    reference = group[0].detach()
    registered = [reference]
    same_label = labels[:, None] == labels[None, :]
    for x in group[1:]:
        cost = torch.cdist(reference.flatten(1), x.detach().flatten(1)).pow(2)
        cost = torch.where(same_label, cost, torch.full_like(cost, 1e12))
        _, cols = linear_sum_assignment(cost.cpu().numpy())
        registered.append(x.detach()[torch.as_tensor(cols, device=x.device)])
    return torch.stack(registered).mean(0)


def finite_or_inf(value: torch.Tensor) -> float:
    v = float(value.detach())
    return v if math.isfinite(v) else float("inf")




def gradient_scale(update) -> float:
    """Factor turning an update into gradient units (Algorithm 1 of Wei et al.,
    lines 4-6: Δw / η), so distance thresholds mean the same for deltas."""
    return 1.0 if update.kind == "gradient" else 1.0 / (update.lr * max(update.steps, 1))
