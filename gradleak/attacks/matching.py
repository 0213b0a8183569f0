"""Shared machinery of gradient-matching attacks.

`UpdateSimulator` recomputes, differentiably, what the client would have sent
for candidate data — the FedSGD gradient, or the τ-step FedAvg delta unrolled
with the same `fl.local.local_update` the client ran. Distances, priors and the
optimisation loop live here so every optimisation attack shares them.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Literal

import torch
import torch.nn.functional as F

from ..fl.local import local_update, model_state
from ..fl.training import TrainingSpec
from ..threat import Observation
from .double_backward import make_twice_differentiable

Tensors = dict[str, torch.Tensor]
Distance = Literal["l2", "cosine", "l1", "weighted-cosine", "layer-cosine"]


class UpdateSimulator:
    """Candidate data → the update the client would send (differentiable)."""

    def __init__(self, obs: Observation, device: torch.device | str = "cpu", *,
                 cheap_double_backward: bool = True):
        self.obs = obs
        # A private copy whose conv / batch-norm layers get the cheaper second
        # derivative (`double_backward`); the observed model is never touched.
        self.cheap_double_backward = cheap_double_backward
        if cheap_double_backward:
            self.model = make_twice_differentiable(copy.deepcopy(obs.model).to(device))
        else:
            self.model = obs.model.to(device)
        self.params, self.buffers = model_state(self.model)
        self.params = {k: v.to(device) for k, v in self.params.items()}
        self.names = [n for n in obs.update.tensors if n in self.params]
        self.target = {n: obs.update.tensors[n].to(device) for n in self.names}
        self.sent = sent_entries(obs, self.target)
        # A FedAvg delta can only be replayed with the local hyper-parameters.
        if obs.update.kind == "delta":
            self.training = obs.training
        else:
            batchnorm = obs.training.batchnorm if obs.knows("local_training") else "train"
            self.training = TrainingSpec(lr=obs.update.lr, batchnorm=batchnorm)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> Tensors:
        buffers = {k: v.clone() for k, v in self.buffers.items()}
        if self.cheap_double_backward and x.grad_fn is None:
            # a non-leaf handle lets the first layer skip its unused input
            # gradient while the update is simulated (see double_backward)
            x = x.view_as(x)
        _, update = local_update(self.model, self.params, buffers, x, y, self.training,
                                 create_graph=True)
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
    from ..defenses import make_chain

    if not any(d.withholds_entries for d in make_chain(obs.get("defenses"))):
        return None
    return {n: (t != 0).to(t.dtype) for n, t in target.items()}


def update_distance(candidate: Tensors, target: Tensors, kind: Distance = "cosine",
                    weights: dict[str, float] | None = None) -> torch.Tensor:
    """Distance between two updates, summed over named tensors.

    l2: Σ‖a−b‖² (DLG); l1; cosine: 1 − ⟨a,b⟩/(‖a‖‖b‖) over the whole
    concatenated update (Geiping et al.); weighted-cosine: the same with a
    per-tensor weight (paper 01's norm-reweighting); layer-cosine: Σ over tensors
    of 1 − cos, so each tensor counts equally and scale-free (quantised targets,
    where one tensor's rounding error outweighs every image-dependent difference
    in a summed L2; docs/rog.md); all-zero target tensors are skipped.
    """
    names = list(target)
    w = weights or {}
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
    # One flat vector per side (weights folded in as √w): three reductions
    # instead of three per tensor, which dominates the cost for small models.
    scale = {n: math.sqrt(w[n]) for n in names if n in w and w[n] != 1.0}
    a = _flat([candidate[n] * scale[n] if n in scale else candidate[n] for n in names])
    b = _flat([target[n] * scale[n] if n in scale else target[n] for n in names])
    return 1 - (a * b).sum() / (a.pow(2).sum().sqrt() * b.pow(2).sum().sqrt() + 1e-12)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic TV (mean absolute neighbour difference) of image batches."""
    if x.dim() < 4:
        return x.new_zeros(())
    dx = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean()
    dy = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean()
    return dx + dy


def random_init(shape: tuple[int, ...], kind: str, generator: torch.Generator) -> torch.Tensor:
    """Starting point of the optimisation: randn (IG), rand (DLG) or gray."""
    if kind == "randn":
        return torch.randn(shape, generator=generator)
    if kind == "rand":
        return torch.rand(shape, generator=generator)
    if kind == "gray":
        return torch.full(shape, 0.5)
    raise ValueError(kind)


def step_decay_lr(iterations: int) -> Callable[[int], float]:
    """×0.1 at 3/8, 5/8 and 7/8 of the run (Geiping et al.)."""
    milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    return lambda it: 0.1 ** sum(it >= m for m in milestones)


def signed_adam_step(optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """Replace the gradient by its sign before Adam (Geiping et al.'s 'signed' Adam)."""
    if x.grad is not None:
        x.grad.sign_()
    optimizer.step()


def finite_or_inf(value: torch.Tensor) -> float:
    v = float(value.detach())
    return v if math.isfinite(v) else float("inf")


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return -(target * F.log_softmax(logits, -1)).sum(-1).mean()
