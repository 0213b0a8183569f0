"""Magnitude gradient pruning (DLG §5, Liu et al. "gradient pruning"): in every
layer, the fraction `ratio` of smallest-magnitude update entries is zeroed."""
from __future__ import annotations

from dataclasses import dataclass

import torch

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

    def two_layer(self, view):
        m, opts = view.width, self.options
        g = view.plain(view.x).detach()
        # scope=layer prunes the a- and W-blocks separately, scope=global the whole vector
        blocks = [(0, m), (m, g.numel())] if opts.scope == "layer" else [(0, g.numel())]
        kept = []
        for lo, hi in blocks:
            keep = (hi - lo) - int(round(opts.ratio * (hi - lo)))
            kept.append(lo + torch.topk(g[lo:hi].abs(), max(keep, 1)).indices)
        coords = torch.sort(torch.cat(kept)).values
        a_mask = coords < m
        return view.result(lambda x_: view.plain(x_)[coords], neurons=coords[a_mask],
                           positions=a_mask.nonzero().flatten(), coordinates=coords,
                           a_share_kept=float(a_mask.sum()) / m)

    def transform_update(self, update, ctx: DefenseContext):
        return update.replace(tensors=sparsify(update.tensors, self.options.ratio, self.options.scope == "layer"))
