"""Magnitude gradient pruning (DLG §5, Liu et al. "gradient pruning"): in every
layer, the fraction `ratio` of smallest-magnitude update entries is zeroed."""
from __future__ import annotations

from dataclasses import dataclass

from ..options import check
from .base import Defense, DefenseContext
from .sparsity import sparsify


@dataclass
class PruneOptions:
    ratio: float = 0.9  # fraction of entries zeroed
    scope: str = "layer"  # layer: threshold per tensor; global: one threshold for the whole update

    def __post_init__(self):
        check(0 <= self.ratio <= 1, f"defense 'prune': ratio must be in [0, 1], got {self.ratio}")
        check(self.scope in ("layer", "global"), f"defense 'prune': scope must be layer or global, got '{self.scope}'")


class GradientPruning(Defense):
    """Zeroes the smallest-magnitude `ratio` of every layer's update entries."""

    name = "prune"
    strength = ("ratio", 1)
    withholds_entries = True
    Options = PruneOptions

    def transform_update(self, update, ctx: DefenseContext):
        return update.replace(tensors=sparsify(update.tensors, self.options.ratio, self.options.scope == "layer"))
