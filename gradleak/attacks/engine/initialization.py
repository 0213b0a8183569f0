"""Starting points of optimisation attacks (CPL's initialisation study, Wei et al. §3.1).

One vocabulary for every optimisation attack: randn (Gaussian; `random` is the
same, the name of DLG's and CPL's code), uniform (`rand` is the same), gray;
and CPL's seeds, which every attack takes too: patterned (a random patch tiled tile×tile over the input),
dark, light, solid red/green/blue, optimal (a same-class example from the
held-out data the threat model may grant as `prior_data`), and learned (the output of the
inverter learned on the defended updates of auxiliary data, `gradleak.attacks.learned.learned`,
which the attacks that offer it pass in as `observed_start(..., learned=...)`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from ...errors import GradleakError
from ...threat import Observation
from ..base import AttackContext

InitKind = Literal["randn", "random", "uniform", "rand", "gray", "patterned", "dark", "light", "r", "g", "b",
                   "optimal", "learned"]
SOLID_CHANNEL = {"r": 0, "g": 1, "b": 2}
# A start computed from the observed update (init=learned: the learned inverter's reconstruction for
# the recovered labels). The attack passes it in, so the engine imports no family above it.
ObservedStart = Callable[[Observation, torch.Tensor, AttackContext], torch.Tensor]


def initial_inputs(kind: InitKind, shape: tuple[int, ...], generator: torch.Generator, *,
                   tile: int = 2, labels: torch.Tensor | None = None, prior_data: Any = None
                   ) -> torch.Tensor:
    """A batch `shape` = (B, *input_shape) to start the optimisation from.

    `labels` and `prior_data` (a `Dataset`) are only needed for `optimal`.
    """
    if kind in ("randn", "random"):  # torch.randn, as in the IG, DLG and CPL reference code
        return torch.randn(shape, generator=generator)
    if kind in ("uniform", "rand"):
        return torch.rand(shape, generator=generator)
    if kind == "gray":
        return torch.full(shape, 0.5)
    if kind == "dark":
        return torch.zeros(shape)
    if kind == "light":
        return torch.ones(shape)
    if kind in SOLID_CHANNEL:
        if len(shape) != 4 or shape[1] != 3:
            raise GradleakError(f"init={kind} needs RGB images (3 channels), got input shape {tuple(shape[1:])}")
        x = torch.zeros(shape)
        x[:, SOLID_CHANNEL[kind]] = 1.0
        return x
    if kind == "patterned":
        return patterned(shape, tile, generator)
    if kind == "optimal":
        return same_class_examples(shape, labels, prior_data, generator)
    if kind == "learned":
        raise GradleakError("init=learned starts from the observed update: ig, cpl, rog and gradinversion take it, "
                            "this attack does not")
    raise GradleakError(f"unknown initialisation '{kind}'")


def patterned(shape: tuple[int, ...], tile: int, generator: torch.Generator) -> torch.Tensor:
    """A uniform random patch of 1/tile of each spatial side, repeated tile×tile
    times (cropped when the side is not divisible). Tabular rows tile along features."""
    spatial = shape[2:] if len(shape) == 4 else shape[1:]
    patch_size = [-(-s // tile) for s in spatial]  # ceil division
    lead = shape[:2] if len(shape) == 4 else shape[:1]
    patch = torch.rand((*lead, *patch_size), generator=generator)
    repeats = (1,) * len(lead) + (tile,) * len(spatial)
    full = patch.repeat(*repeats)
    index = tuple(slice(None) for _ in lead) + tuple(slice(0, s) for s in spatial)
    return full[index].contiguous()


def same_class_examples(shape: tuple[int, ...], labels: torch.Tensor | None, prior_data: Any,
                        generator: torch.Generator) -> torch.Tensor:
    """CPL-optimal: for every (recovered) label, a random held-out example of that class."""
    if labels is None:
        raise GradleakError("init=optimal needs the labels before the optimisation starts")
    if prior_data is None:
        raise GradleakError("init=optimal needs held-out data (grant prior_data: --threat informed or "
                            "--knows prior_data)")
    rows = []
    for label in labels.tolist():
        pool = (prior_data.labels == label).nonzero().flatten()
        if len(pool) == 0:
            raise GradleakError(f"init=optimal: the held-out data has no example of class {label}")
        pick = pool[torch.randint(len(pool), (1,), generator=generator)]
        rows.append(prior_data.inputs[pick].reshape(1, *shape[1:]).float())
    return torch.cat(rows)


def observed_start(kind: InitKind, shape: tuple[int, ...], generator: torch.Generator, obs: Observation,
                   labels: torch.Tensor, ctx: AttackContext, *, tile: int = 2,
                   learned: ObservedStart | None = None) -> torch.Tensor:
    """`initial_inputs` for an attack on `obs`: `optimal` reads the held-out examples the
    threat model grants (the attack's `needs` asks for them) and the recovered `labels`;
    `learned` is `learned(obs, labels, ctx)`, the learned inverter's reconstruction of `obs` for
    those labels (trained once per setting and kept in `ctx.artifacts`), the same for every
    restart; an attack that passes no `learned` does not take init=learned."""
    if kind == "learned" and learned is not None:
        return learned(obs, labels, ctx).reshape(shape)
    prior = obs.get("prior_data") if kind == "optimal" else None
    return initial_inputs(kind, shape, generator, tile=tile, labels=labels.cpu(), prior_data=prior)
