"""The objective of the optimisation engine (`engine`): the matching distance
between the simulated and the observed update, and the priors added to it with
their weights — total variation, the batch-norm statistics prior, an l2 norm,
group consistency of restarts, CPL's label confidence, LAMP's embedding norm — or an
attack's own `Prior` (e.g. feature-prior's feature matching, LAMP's bigram language
prior). FedLeak's two terms (Fan, Wang, Chen, Zhou, USENIX Security 2025): `PartialDistance`,
a distance over a chosen part of each tensor of the update, and `GradientRegularisation`, a
regulariser the engine applies to each step through a look-ahead gradient."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ...options import check
from ...priors import bn_statistics_distance, total_variation
from ..replay.matching import update_distance

Tensors = Mapping[str, torch.Tensor]


class Matching:
    """The distance between the update the client would send for (x, y) — `simulate`,
    e.g. an `UpdateSimulator` — and the observed `target`.

    `distance`: a name of `matching.update_distance` or a function (simulated,
    target) → scalar. `scale` multiplies both updates (CPL and DLG compare FedAvg
    deltas in gradient units, Δw/η). `normalise`: divide by the distance at the
    first candidate evaluated, so optimisers' absolute tolerances and the priors'
    weights mean the same whatever the update's magnitude (ROG)."""

    def __init__(self, simulate: Callable[[torch.Tensor, torch.Tensor], Tensors], target: Tensors,
                 distance: str | Callable[[Tensors, Tensors], torch.Tensor] = "cosine", *,
                 weights: dict[str, float] | None = None, scale: float = 1.0, normalise: bool = False):
        self.simulate, self.distance_kind, self.weights = simulate, distance, weights
        self.scale = scale
        self.target = {n: t * scale for n, t in target.items()} if scale != 1.0 else dict(target)
        self.normalise = normalise
        self.reference: float | None = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        simulated = self.simulate(x, y)
        if self.scale != 1.0:
            simulated = {n: simulated[n] * self.scale for n in self.target}
        if callable(self.distance_kind):
            distance = self.distance_kind(simulated, self.target)
        else:
            distance = update_distance(simulated, self.target, self.distance_kind, self.weights)  # type: ignore[arg-type]
        if self.normalise:
            if self.reference is None:
                self.reference = float(distance.detach()) or 1.0
            distance = distance / self.reference
        return distance


class PartialDistance:
    """FedLeak's partial gradient matching: each tensor of the update is compared on only the
    `keep` fraction of its entries largest in magnitude. An entry that is small in the
    simulated update depends little on the candidate and is mostly the fit's noise (Fan et al.
    find that matching every entry is what fails at realistic batch sizes); dropping it lets
    the optimiser spend its steps on the entries that constrain the data.

    `select`: whose magnitudes choose the entries — `simulated` (the candidate's own update,
    re-chosen at every evaluation, as FedLeak's released code does) or `target` (the observed
    update's, fixed). The choice is a mask, not differentiated. `distance` on the kept
    entries (the others count as zero on both sides): a name of `update_distance` — `cosine`
    over the whole update (IG's), `layer-cosine` (Σ over tensors of 1 − cosine), `l2`, `l1`
    — or `l1+layer-cosine`, FedLeak's: Σ over tensors of the mean absolute difference over the
    tensor's entries plus 1 − cosine. A tensor whose kept target entries are all zero (a
    sparsified update) has no direction and adds no cosine term."""

    def __init__(self, keep: float = 0.5, select: Literal["simulated", "target"] = "simulated",
                 distance: Literal["cosine", "layer-cosine", "l1+layer-cosine", "l2", "l1"] = "cosine"):
        check(0 < keep <= 1, f"partial matching: keep must be in (0, 1], got {keep}")
        self.keep, self.select, self.distance = keep, select, distance

    def mask(self, reference: torch.Tensor) -> torch.Tensor | None:
        """True at the `keep` fraction of `reference`'s entries largest in magnitude (ties at the
        threshold kept); None when every entry is kept."""
        n = reference.numel()
        kept = max(1, math.ceil(self.keep * n))
        if kept >= n:
            return None
        magnitude = reference.detach().abs().reshape(-1)
        # the kept-th largest magnitude; kthvalue, unlike torch.quantile, has no size limit
        threshold = magnitude.kthvalue(n - kept + 1).values
        return (magnitude >= threshold).view_as(reference)

    def kept(self, simulated: Tensors, target: Tensors) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Both updates with the entries not chosen set to zero."""
        sim, tgt = {}, {}
        for name, t in target.items():
            g = simulated[name]
            mask = self.mask(g if self.select == "simulated" else t)
            sim[name], tgt[name] = (g, t) if mask is None else (g * mask, t * mask)
        return sim, tgt

    def __call__(self, simulated: Tensors, target: Tensors) -> torch.Tensor:
        sim, tgt = self.kept(simulated, target)
        if self.distance != "l1+layer-cosine":
            return update_distance(sim, tgt, self.distance)  # type: ignore[arg-type]
        total = update_distance(sim, tgt, "layer-cosine")
        for name, t in tgt.items():
            total = total + (sim[name] - t).abs().mean()
        return total


@dataclass
class GradientRegularisation:
    """FedLeak's gradient regularisation, applied by the engine to each step: instead of the
    objective's gradient g(v) at the candidate's variables v, the step follows

        (1 − weight) · g(v) + weight · g(v + Δ),

    the gradient mixed with the one at a probe point v + Δ (each signed first when the
    optimiser is signed Adam). `probe="step"`: Δ is the step the optimiser would take from v
    (its state and v restored afterwards) — FedLeak's released code (weight 0.3, the
    "forward gradient"); to first order the mix is the gradient at v + weight·Δ, a partial
    look-ahead as in extragradient methods: the step bends toward where it is about to land.
    `probe="ascent"`: Δ = radius · g/‖g‖, the first-order form of the gradient-norm penalty
    D + weight·radius·‖∇_v D‖ (Zhao, Zhang and Hu, ICML 2022), which favours flat minima.
    Costs a second evaluation of the objective per step; not for L-BFGS."""

    weight: float = 0.3
    probe: Literal["step", "ascent"] = "step"
    radius: float = 0.01

    def __post_init__(self):
        check(0 <= self.weight <= 1, f"gradient regularisation: weight must be in [0, 1], got {self.weight}")
        check(self.radius > 0, f"gradient regularisation: radius must be > 0, got {self.radius}")


# --------------------------------------------------------------------------- priors

@dataclass
class Seen:
    """What a prior may look at during one evaluation: the candidate, the labels, the
    inputs the watched layers received while the update was simulated (first local
    step first), the iteration, and the registered mean of a restart group."""

    x: torch.Tensor
    labels: torch.Tensor
    layer_inputs: dict[nn.Module, list[torch.Tensor]]
    iteration: int
    iterations: int
    group_mean: torch.Tensor | None = None
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None


class Prior(ABC):
    """A weighted term added to the matching distance."""

    weight: float = 0.0

    def watch(self, model: nn.Module | None) -> list[nn.Module]:
        """Layers whose inputs this prior reads from the simulated forward passes."""
        return []

    @abstractmethod
    def __call__(self, seen: Seen) -> torch.Tensor | None:
        """The unweighted term, or None when it does not apply to this evaluation."""


@dataclass
class TotalVariation(Prior):
    weight: float = 0.0

    def __call__(self, seen: Seen) -> torch.Tensor:
        return total_variation(seen.x)


@dataclass
class L2Norm(Prior):
    """Mean squared input value (GradInversion's l2 prior)."""

    weight: float = 0.0

    def __call__(self, seen: Seen) -> torch.Tensor:
        return seen.x.pow(2).mean()


@dataclass
class BNStatistics(Prior):
    """The batch-norm prior: each BN layer's batch statistics of the candidate pulled
    to those of the client's batch (`target`, one (mean, var) per layer). With
    `from_update` the statistics come from the simulated update's first local step
    (which saw the whole batch); otherwise from a separate forward pass of the
    candidate through the model as sent."""

    weight: float = 0.0
    target: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    from_update: bool = True
    layers: list[nn.Module] = field(default_factory=list)

    def watch(self, model):
        if model is not None and not self.layers:
            self.layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        return self.layers

    def __call__(self, seen: Seen) -> torch.Tensor | None:
        if not self.target or not self.layers:
            return None
        if not self.from_update and seen.forward is not None:
            for inputs in seen.layer_inputs.values():
                inputs.clear()
            seen.forward(seen.x)
        captured = [seen.layer_inputs[m][0] for m in self.layers if seen.layer_inputs.get(m)]
        if len(captured) < len(self.target):
            return None
        return bn_statistics_distance(captured[:len(self.target)], self.target)


@dataclass
class GroupConsistency(Prior):
    """‖x − registered group mean‖² (GradInversion), from `start` × the run onwards."""

    weight: float = 0.0
    start: float = 0.25

    def __call__(self, seen: Seen) -> torch.Tensor | None:
        if seen.group_mean is None or seen.iteration < int(self.start * seen.iterations):
            return None
        return (seen.x - seen.group_mean).pow(2).mean()


@dataclass
class LabelConfidence(Prior):
    """‖softmax(f(x)) − onehot(y)‖² (CPL's label regulariser, weight α)."""

    weight: float = 0.0
    num_classes: int = 0

    def __call__(self, seen: Seen) -> torch.Tensor | None:
        if seen.forward is None:
            return None
        logits = seen.forward(seen.x)
        onehot = torch.nn.functional.one_hot(seen.labels.long(), self.num_classes).to(logits)
        return (logits.softmax(-1) - onehot).pow(2).sum()


@dataclass
class EmbeddingNorm(Prior):
    """(mean norm of the candidate's input embeddings / `reference` − 1)², `reference` the mean
    norm of the model's token embeddings: keeps embeddings at the scale of real tokens' (LAMP)."""

    weight: float = 0.0
    reference: float | torch.Tensor = 1.0

    def __call__(self, seen: Seen) -> torch.Tensor:
        return (seen.x.norm(dim=-1).mean() / self.reference - 1).pow(2)
