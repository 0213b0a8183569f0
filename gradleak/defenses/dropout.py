"""Dropout, at either of the two places the papers put it.

place=update (default): gradient dropout, every update entry is zeroed with
probability p (no rescaling; the server sees which entries are missing).
place=model: a dropout layer (rate p) in front of the classifier head, as in
Wei et al.'s model-level knobs and Liu et al.'s dropout analysis (effective width
(1-p)m). The attacker gets the model but not the client's masks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import GradleakError
from ..models import last_linear
from ..options import check
from .base import Defense, DefenseContext


@dataclass
class DropoutOptions:
    p: float = 0.5  # drop probability
    place: str = "update"  # update: gradient dropout; model: dropout layer before the classifier
    seed: int = 0  # seed of the model-level dropout masks

    def __post_init__(self):
        check(0 <= self.p < 1 if self.place == "model" else 0 <= self.p <= 1,
              f"defense 'dropout': p must be in [0, 1] (model dropout: [0, 1)), got {self.p}")
        check(self.place in ("update", "model"),
              f"defense 'dropout': place must be update or model, got '{self.place}'")


class SeededDropout(nn.Module):
    """nn.Dropout drawing masks from its own generator, so runs repeat exactly."""

    def __init__(self, p: float, seed: int):
        super().__init__()
        self.p = p
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.rand(x.shape, generator=self.generator) >= self.p
        return x * keep.to(x) / (1 - self.p)


def insert_before_classifier(model: nn.Module, layer: nn.Module) -> nn.Module:
    """Replace the model's last nn.Linear by Sequential(layer, that linear)."""
    name, linear = last_linear(model)
    parent = model
    *path, leaf = name.split(".")
    for part in path:
        parent = getattr(parent, part)
    setattr(parent, leaf, nn.Sequential(layer, linear))
    return model


class Dropout(Defense):
    """Gradient dropout (entries zeroed with prob. p) or a dropout layer before the classifier."""

    name = "dropout"
    Options = DropoutOptions

    @property
    def places(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.options.place,)

    @property
    def withholds_entries(self) -> bool:  # type: ignore[override]
        return self.options.place == "update"

    def check_two_layer(self) -> None:
        if self.options.place != "model":
            raise GradleakError("defense 'dropout': the two-layer analysis drops hidden units, i.e. "
                                "dropout:place=model (place=update drops single update entries)")

    def two_layer(self, view):
        # place=model: hidden units dropped, effective width (1 − p)m
        m, dim = view.width, view.dim
        gen = torch.Generator().manual_seed(self.options.seed)
        kept = (torch.rand(m, generator=gen) >= self.options.p).nonzero().flatten()
        if len(kept) == 0:
            raise GradleakError("dropout: every hidden unit was dropped")
        coords = torch.cat([kept, m + (kept[:, None] * dim + torch.arange(dim)).flatten()])
        return view.result(lambda x_: view.plain(x_)[coords], neurons=kept, positions=torch.arange(len(kept)),
                           width=float(len(kept)), coordinates=coords)

    def transform_model(self, model: nn.Module) -> nn.Module:
        if self.options.place != "model":
            return model
        return insert_before_classifier(model, SeededDropout(self.options.p, self.options.seed))

    def transform_update(self, update, ctx: DefenseContext):
        if self.options.place != "update":
            return update
        p = self.options.p
        return update.map(lambda _, t: t * (torch.rand(t.shape, generator=ctx.generator) >= p).to(t))
