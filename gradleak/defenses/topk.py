"""Top-k sparsification (Aji & Heafield 2017; Yue et al. φ_topk): only the largest
(1 - sparsity) fraction of the whole update's entries, by magnitude, is sent."""
from __future__ import annotations

from dataclasses import dataclass

from ..options import check
from .base import Defense, DefenseContext
from .sparsity import sparsify


@dataclass
class TopKOptions:
    sparsity: float = 0.95  # fraction of entries zeroed (Yue et al. use 0.95)

    def __post_init__(self):
        check(0 <= self.sparsity <= 1, f"defense 'topk': sparsity must be in [0, 1], got {self.sparsity}")


class TopK(Defense):
    """Sends only the largest (1 - sparsity) share of update entries."""

    name = "topk"
    strength = ("sparsity", 1)
    withholds_entries = True
    Options = TopKOptions

    def transform_update(self, update, ctx: DefenseContext):
        return update.replace(tensors=sparsify(update.tensors, self.options.sparsity, per_tensor=False))
