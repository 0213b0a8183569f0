"""Re-identification when the attack hands back a set of candidates.

Scoring matches reconstructions to originals with the ground truth (Hungarian on MSE), which
is how a batch must be scored — but it is a choice made with the originals in hand. Compared
with the gallery afterwards, the chosen candidate is nearer its original than to a gallery
example even when every candidate carries nothing: four random images matched to a batch of
four MNIST digits reach a linkage AUC of 0.67, forty random candidates (a malicious attack's
bins under heavy noise) 0.89, where one random image against one digit gives 0.50. So the
gallery gets the same choice: an original's distance is its nearest candidate's, a gallery
example's is *its* nearest candidate's, and the original is ranked among the gallery on those.
Original and gallery examples are then exchangeable when the candidates carry nothing, and the
linkage AUC is 0.5 again (measured: docs/judging.md).

Given every candidate, though, a gallery example competes through the *other* originals'
reconstructions too: one that resembles another example of the batch meets that example's good
reconstruction, so at batch 50 an original loses to the gallery although its own reconstruction
is plainly right (MNIST, the true features of a ReLU LeNet-5 inverted, SSIM 0.90 median: 20 of
50 re-identified, 25 of 25 when half the batch is judged alone; docs/judging.md). So a candidate
that another original of the batch is strictly nearer to than this original and every gallery
example are — a candidate that already points at another example — is that example's, and
judges neither this original nor the gallery (`others_claim`). Whether a candidate is claimed
depends on the other originals and on the nearest member of {this original} ∪ gallery, a
symmetric function of that set, so under the null the original and the gallery examples stay
exchangeable and the chance rate and the permutation null are unchanged."""
from __future__ import annotations

import torch

from .distance_matrix import REFINE_MARGIN, l2_matrix, lpips_matrix, lpips_norms
from .linkage import linkage_among, null_linkage_variance, rank_and_auc
from .reidentify import (
    Distance,
    Gallery,
    Judgement,
    batch_features,
    duplicate_pairs,
    fast_distances,
    gallery_features,
    gallery_scale,
    linkage_distances,
    reference_distances,
)


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each distinct row of `rows` (compared whole, by value) first occurs, and for each
    row the position of its distinct row in that list: rows[first][inverse] equals rows."""
    if not len(rows):
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    _, inverse = torch.unique(rows.flatten(1), dim=0, return_inverse=True)
    positions = torch.arange(len(rows))
    first = torch.full((int(inverse.max()) + 1,), len(rows)).scatter_reduce_(0, inverse, positions, "amin")
    return first, inverse


def judge_candidates(originals: torch.Tensor, candidates: torch.Tensor, gallery: Gallery,
                     distances: tuple[Distance, ...], backbone: str = "alex", pad_token: int | None = None,
                     lpips_features: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
                     linkage: tuple[Distance, ...] | None = None, labels: torch.Tensor | None = None,
                     others_claim: bool = False) -> Judgement:
    """Rank every original among `gallery` by its nearest candidate (module docstring); the
    Judgement of `reidentify.judge`. Token sequences (`distances` ("tokens",)) keep their ids.
    `lpips_features`: the finite candidates' and the originals' `unit_features` when the
    caller has them already, so each image's features are computed once. `linkage`, `labels`:
    as in `reidentify.judge`. `others_claim`: a candidate that another original of the batch is
    strictly nearer to than this original and every gallery example is that original's, and
    judges neither this original nor the gallery against it (module docstring)."""
    linkage = linkage_distances(distances) if linkage is None else linkage
    wanted = tuple(dict.fromkeys(distances + linkage))
    if "tokens" in wanted:
        originals, candidates = originals.long().cpu(), candidates.long().cpu()
    else:
        originals = originals.detach().float().cpu()
        candidates = candidates.detach().float().cpu()
        finite = torch.isfinite(candidates.flatten(1)).all(1)
        if lpips_features is not None and not bool(finite.all()):
            lpips_features = [f[finite] for f in lpips_features[0]], lpips_features[1]
        candidates = candidates[finite]
    n, size = len(originals), len(gallery)
    if size == 0:
        return Judgement([{d: 0 for d in wanted} for _ in range(n)], [0] * n, [None] * n, [{} for _ in range(n)])
    if not len(candidates) or not n:
        return Judgement([{d: size for d in wanted} for _ in range(n)], [size] * n, [0.5] * n,
                         [{d: 0.5 for d in linkage} for _ in range(n)])
    first, _ = distinct_rows(candidates)
    if len(first) < len(candidates):  # identical candidates are at the same distance from everything
        candidates = candidates[first]
        if lpips_features is not None:
            lpips_features = [f[first] for f in lpips_features[0]], lpips_features[1]
    counted = ~duplicate_pairs(originals, gallery.inputs.to(originals.dtype).cpu())
    among = linkage_among(counted, labels, gallery.labels)
    batch = Gallery(originals, "the attacked batch")
    ranks: list[dict[str, int]] = [{} for _ in range(n)]
    aucs: list[dict[str, float]] = [{} for _ in range(n)]
    linked = []
    if "lpips" in wanted and lpips_features is None:
        lpips_features = batch_features(candidates, originals, backbone, None, [])
    for distance in wanted:
        mine = None if lpips_features is None else (lpips_features[0], lpips_features[0])
        to_gallery, _ = fast_distances(candidates, candidates, gallery, distance, backbone, pad_token, mine)
        if distance == "l2z":  # in the gallery's units, not the batch's
            to_batch, _ = l2_matrix(candidates, candidates, originals, gallery_scale(gallery))
        elif distance == "lpips" and lpips_features is not None:
            # the batch's features are in hand: no Gallery, so nothing of the batch is cached
            from .lpips import load_lpips

            model = load_lpips(backbone)  # type: ignore[arg-type]
            theirs = lpips_features[1]
            to_batch, _ = lpips_matrix(model, lpips_features[0], lpips_features[0], theirs,
                                       lpips_norms(model, theirs))
        else:
            to_batch, _ = fast_distances(candidates, candidates, batch, distance, backbone, pad_token)
        nearest_gallery, nearest_original = _exact_nearest(candidates, originals, gallery, distance, backbone,
                                                           to_gallery, to_batch, lpips_features)
        per_original = nearest_gallery[None].expand(n, -1)  # every original meets the same gallery side
        if others_claim:  # ... but through the candidates no other original claims
            claimed = _claimed(to_gallery, to_batch)
            per_original = per_original.clone()
            for i in claimed.any(0).nonzero().flatten().tolist():  # the others keep every candidate
                rows = (~claimed[:, i]).nonzero().flatten()
                per_original[i], nearest_original[i] = float("inf"), float("inf")
                if len(rows):
                    per_original[i], nearest_original[i:i + 1] = _exact_nearest(
                        candidates[rows], originals[i:i + 1], gallery, distance, backbone, to_gallery[rows],
                        to_batch[rows][:, i:i + 1], _rows_of(lpips_features, rows, i))
        closer, auc = rank_and_auc(per_original, nearest_original, counted, among)
        if distance in linkage:
            linked.append((per_original, nearest_original))
        for i in range(n):
            ranks[i][distance] = int(closer[i])
            if distance in linkage:
                aucs[i][distance] = float(auc[i])
    null = null_linkage_variance(linked, among).tolist() if linked else [None] * n
    return Judgement(ranks, [min(r[d] for d in distances) for r in ranks],
                     [sum(a.values()) / len(a) if a else 0.5 for a in aucs], aucs, null)


def _claimed(to_gallery: torch.Tensor, to_batch: torch.Tensor) -> torch.Tensor:
    """(m, n): candidate c is claimed away from original i when another original of the batch is
    strictly nearer to it than i and every gallery example are."""
    m, n = to_batch.shape
    if n < 2:
        return torch.zeros(m, n, dtype=torch.bool)
    two = to_batch.topk(2, dim=1, largest=False)
    best, second, nearest = two.values[:, 0], two.values[:, 1], two.indices[:, 0]
    other = torch.where(nearest[:, None] == torch.arange(n)[None], second[:, None], best[:, None])
    return other < torch.minimum(to_gallery.min(1).values[:, None], to_batch)


def _rows_of(features, rows: torch.Tensor, original: int):
    """The LPIPS features of candidate `rows` and of one original."""
    if features is None:
        return None
    return [f[rows] for f in features[0]], [f[original:original + 1] for f in features[1]]


def _exact_nearest(candidates, originals, gallery: Gallery, distance: str, backbone: str, to_gallery: torch.Tensor,
                   to_batch: torch.Tensor, features) -> tuple[torch.Tensor, torch.Tensor]:
    """The nearest candidate's distance to each gallery example (G,) and to each original (n,),
    from the fast distances, recomputed by the per-pair reference (as `reidentify._refine`
    does) where a gallery example's lies within REFINE_MARGIN of an original's: there the
    fast distances cannot order them, so ranks and ties would not be the definition's."""
    nearest_gallery, nearest_original = to_gallery.min(0).values, to_batch.min(0).values
    if distance in ("tokens", "l2z"):  # already exact: computed as the reference computes them
        return nearest_gallery, nearest_original
    margin = REFINE_MARGIN * nearest_original.abs().clamp_min(1)
    close = (nearest_gallery[None] - nearest_original[:, None]).abs() <= margin[:, None]  # (n, G)
    if not bool(close.any()):
        return nearest_gallery, nearest_original
    nearest_gallery, nearest_original = nearest_gallery.clone(), nearest_original.clone()
    model = None
    if distance == "lpips":
        from .lpips import load_lpips

        model = load_lpips(backbone)  # type: ignore[arg-type]
        gallery_lpips = gallery_features(gallery, backbone)

    def exact_min(fast: torch.Tensor, other: torch.Tensor, other_features) -> torch.Tensor:
        """The exact nearest of the candidates to one image: only those whose fast distance lies
        within the margin of the fast nearest can be it."""
        rows = (fast <= fast.min() + REFINE_MARGIN * float(fast.min().abs().clamp_min(1))).nonzero().flatten()
        if model is not None:
            with torch.no_grad():
                exact = [model.feature_distance([f[r:r + 1] for f in features[0]], other_features)[0]
                         for r in rows.tolist()]
        else:
            exact = [reference_distances(candidates[r], other[None], distance, backbone)[0] for r in rows.tolist()]
        return torch.stack(exact).min().to(fast.dtype)

    for g in close.any(0).nonzero().flatten().tolist():
        theirs = None if model is None else [f[g:g + 1] for f in gallery_lpips]
        nearest_gallery[g] = exact_min(to_gallery[:, g], gallery.inputs[g].float(), theirs)
    for i in close.any(1).nonzero().flatten().tolist():
        theirs = None if model is None else [f[i:i + 1] for f in features[1]]
        nearest_original[i] = exact_min(to_batch[:, i], originals[i], theirs)
    return nearest_gallery, nearest_original
