"""Deep-gradient-compression-style sparsification (Lin et al. 2018; CPL Tab. 7).

Compression θ%: in every tensor the θ% smallest-magnitude entries of
(update + residual) are withheld; what was withheld is accumulated locally in
the client's memory (`DefenseContext.state`) and added to the next round's update.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..options import check
from .base import Defense, DefenseContext
from .sparsity import magnitude_mask


@dataclass
class DGCOptions:
    theta: float = 40.0  # compression rate in percent: share of entries not sent this round
    residual: bool = True  # accumulate withheld entries locally (DGC); false: plain per-layer pruning

    def __post_init__(self):
        check(0 <= self.theta < 100, f"defense 'dgc': theta must be a percentage in [0, 100), got {self.theta}")


class DGC(Defense):
    """Withholds θ% smallest entries per tensor, accumulating them locally for later rounds."""

    name = "dgc"
    strength = ("theta", 1)
    withholds_entries = True
    Options = DGCOptions

    def transform_update(self, update, ctx: DefenseContext):
        residuals = ctx.state.setdefault("residual", {})
        sent = {}
        for name, t in update.tensors.items():
            accumulated = t + residuals[name] if self.options.residual and name in residuals else t
            mask = magnitude_mask(accumulated, self.options.theta / 100)
            sent[name] = accumulated * mask
            if self.options.residual:
                residuals[name] = (accumulated * ~mask).detach()
        return update.replace(tensors=sent)
