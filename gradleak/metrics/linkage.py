"""The statistics of an original's place among a gallery, by one distance or several: its rank
and linkage AUC (`rank_and_auc`), the gallery examples its linkage is judged among
(`linkage_among`: those that share its label), and the linkage's variance under the original's
own permutation null (`null_linkage_variance`), which the leak test weighs a linkage against
(gradleak.leakage, docs/judging.md)."""
from __future__ import annotations

import torch

from ..leakage import NULL_LINKAGE_VARIANCE

# An original's linkage is judged among the gallery examples that share its label when at least
# this many do, else among the whole gallery. Why: the update gives its labels away (label
# recovery), and a reconstruction that is only its class's average shape would pick its original
# out of a mixed gallery by the label alone; among its own class it carries nothing, and links
# as chance does (measured in docs/judging.md and docs/flower.md).
MIN_SAME_LABEL = 10


def linkage_among(counted: torch.Tensor, labels: torch.Tensor | None, gallery_labels: torch.Tensor | None
                  ) -> torch.Tensor:
    """Per original (rows of `counted`, (n, G)), the gallery examples its linkage is judged among:
    the counted ones with its label, and those whose label is unknown (gallery label < 0), where
    at least MIN_SAME_LABEL counted examples have its label; the whole counted gallery otherwise,
    or when either side's labels are not one class per example."""
    n, size = counted.shape
    if labels is None or gallery_labels is None or labels.dim() != 1 or len(labels) != n \
            or gallery_labels.dim() != 1 or len(gallery_labels) != size:
        return counted
    labels, gallery_labels = labels.long().cpu(), gallery_labels.long().cpu()
    same = gallery_labels[None, :] == labels[:, None]
    enough = (same & counted).sum(1) >= MIN_SAME_LABEL
    among = counted & (same | (gallery_labels < 0)[None, :])
    return torch.where(enough[:, None], among, counted)


def null_linkage_variance(linked: list[tuple[torch.Tensor, torch.Tensor]], counted: torch.Tensor) -> torch.Tensor:
    """Per original, the variance of its linkage (the mean AUC over the linkage distances) under
    its own permutation null: when the reconstruction carries nothing, the original is one more
    example of the distribution, exchangeable with the gallery examples it is linked among
    (`counted`, (n, G): `linkage_among`'s, or all but its duplicates), so its linkage is that of
    a member of {original} ∪ those drawn at random, each member's AUC taken among the others.
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

    # rows that count the same gallery examples (the whole gallery, or one label's) at once
    masks, group = torch.unique(counted, dim=0, return_inverse=True)
    for g, mask in enumerate(masks):
        rows = (group == g).nonzero().flatten()
        members = None
        for to_gallery, to_original in linked:
            gallery_side = to_gallery[rows][:, mask]
            aucs = member_aucs(torch.cat([to_original[rows, None], gallery_side], 1).double())
            members = aucs if members is None else members + aucs
        members = members / len(linked)
        if members.shape[1] > 1:
            out[rows] = members.var(dim=1, unbiased=False)
    return out


def rank_and_auc(to_gallery: torch.Tensor, to_original: torch.Tensor, counted: torch.Tensor,
                 among: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per original (rows of `to_gallery`, one entry of `to_original` each): its rank, the
    counted gallery examples at least as close as the original, and its linkage AUC, the
    fraction of the examples it is linked `among` (default: the counted ones; `linkage_among`)
    strictly farther, ties one half. `counted` leaves out the original's duplicates."""
    among = counted if among is None else among
    at_least_as_close = ((to_gallery <= to_original[:, None]) & counted).sum(1)
    farther = ((to_gallery > to_original[:, None]) & among).sum(1).double()
    tied = ((to_gallery == to_original[:, None]) & among).sum(1).double()
    return at_least_as_close, (farther + tied / 2) / among.sum(1).clamp_min(1).double()
