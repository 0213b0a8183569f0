"""The statistics of an original's place among a gallery, by one distance or several: its rank
and linkage AUC (`rank_and_auc`), and the linkage's variance under the original's own
permutation null (`null_linkage_variance`), which the leak test weighs a linkage against
(gradleak.leakage, docs/judging.md)."""
from __future__ import annotations

import torch

from ..leakage import NULL_LINKAGE_VARIANCE


def null_linkage_variance(linked: list[tuple[torch.Tensor, torch.Tensor]], counted: torch.Tensor) -> torch.Tensor:
    """Per original, the variance of its linkage (the mean AUC over the linkage distances) under
    its own permutation null: when the reconstruction carries nothing, the original is one more
    example of the distribution, exchangeable with the counted gallery, so its linkage is that of
    a member of {original} ∪ gallery drawn at random, each member's AUC taken among the others.
    `linked`: per linkage distance, (to_gallery (n, G), to_original (n,)). A single distance
    gives 1/12 (less a little for ties); several that rank alike give nearly that, several
    that disagree less, which is the power averaging them buys (gradleak.leakage)."""
    n = linked[0][1].shape[0]
    out = torch.full((n,), NULL_LINKAGE_VARIANCE, dtype=torch.float64)

    def member_aucs(pool: torch.Tensor) -> torch.Tensor:  # (rows, M): each member's AUC among the rest
        # with r its average rank (1-based, ties share), a member has M − r others above it, ties half
        m = pool.shape[1]
        ordered, order = pool.sort(dim=1)
        ranks = torch.empty_like(pool).scatter_(1, order, torch.arange(1, m + 1, dtype=pool.dtype).expand_as(pool))
        tied = (ordered[:, 1:] == ordered[:, :-1]).any(1).nonzero().flatten()
        if len(tied):  # distances are rarely equal: only those rows pay for the average ranks
            below = torch.searchsorted(ordered[tied], pool[tied], right=False)
            at_most = torch.searchsorted(ordered[tied], pool[tied], right=True)
            ranks[tied] = (below + at_most + 1).to(pool.dtype) / 2
        return (m - ranks) / max(m - 1, 1)

    # rows with the whole gallery counted at once; rows that leave a duplicate out one by one
    whole = counted.all(1)
    groups = [(whole.nonzero().flatten(), None)] + [(torch.tensor([k]), counted[k])
                                                    for k in (~whole).nonzero().flatten().tolist()]
    for rows, mask in groups:
        if not len(rows):
            continue
        members = None
        for to_gallery, to_original in linked:
            gallery_side = to_gallery[rows] if mask is None else to_gallery[rows][:, mask]
            aucs = member_aucs(torch.cat([to_original[rows, None], gallery_side], 1).double())
            members = aucs if members is None else members + aucs
        members = members / len(linked)
        if members.shape[1] > 1:
            out[rows] = members.var(dim=1, unbiased=False)
    return out


def rank_and_auc(to_gallery: torch.Tensor, to_original: torch.Tensor, counted: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per original (rows of `to_gallery`, one entry of `to_original` each): its rank, the
    counted gallery examples at least as close as the original, and its linkage AUC, the
    fraction strictly farther with ties one half. `counted` leaves out the original's duplicates."""
    at_least_as_close = ((to_gallery <= to_original[:, None]) & counted).sum(1)
    farther = ((to_gallery > to_original[:, None]) & counted).sum(1).double()
    tied = ((to_gallery == to_original[:, None]) & counted).sum(1).double()
    return at_least_as_close, (farther + tied / 2) / counted.sum(1).clamp_min(1).double()
