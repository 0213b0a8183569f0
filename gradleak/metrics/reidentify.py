"""Re-identification: does a reconstruction point back to its original among others like it?

PSNR and SSIM say how close a reconstruction is to its original; they do not say whether
a person who sees it learns *which* example the client held. Re-identification asks that
directly, as the image identifiability precision of Hatamizadeh et al. (IEEE TMI 2023)
does: the reconstruction is compared with its original and with a gallery of other
examples of the same distribution, none of them in the attacked batch, and it
*identifies* its original when the original is its nearest neighbour — strictly nearer
than every gallery example.

Two perceptual distances judge images: SSIM (as 1 − SSIM), and LPIPS (Zhang et al., CVPR
2018) for images with 1 or 3 channels of at least 16 px a side unless LPIPS is switched
off; the reconstruction identifies its original when the original is its nearest
neighbour under either. Neither
alone is enough: on MNIST, LPIPS (computed on the 64 px upsampled digit) misses blurred
digits that are plainly readable (0 of 40 at a 5 × 5 box blur, where SSIM finds 22), and
SSIM misses some heavily blurred faces that LPIPS finds (LFW, 7 × 7 blur: 6 vs 8 of 10).
Tabular records use the Euclidean distance between feature vectors. Token sequences use
1 − the F-measure of their token overlap (the multiset of token ids, padding left out: ROUGE-1
on ids), so a recovered bag of words identifies its sentence even in the wrong order, as it
would for a reader. A reconstruction that
carries nothing about its original finds it by chance with probability at most
(number of distances) / (gallery size + 1) — the union bound, which is the chance level
reported. Gallery examples identical to the original (duplicates in the data) are left
out of its comparison.

A yes/no rank-0 test has little power, and one chance event flips it. Each example also gets
its *linkage* (`judge`): the fraction of gallery examples strictly farther from the
reconstruction than its original (ties count one half) — the AUC of telling the original
from the gallery by that distance — averaged over the modality's linkage distances
(`linkage_distances`; pictures add Pearson, 1 − pixel correlation, which reads partial,
noise-like reconstructions SSIM and LPIPS miss). A reconstruction that carries nothing ranks its original uniformly
among the gallery, so each distance's AUC, and their mean, is 0.5 on average; a
recognisable one is near 1. Which distances enter, and the perceptual bars of
`recognizable` (re-identified *and* looking like the original: scoring.RECOGNIZABLE_*,
text.RECOGNIZABLE_ROUGE1), were calibrated on data the project does not report on:
docs/judging.md.

All reconstructions of a batch are judged against the gallery at once
(gradleak.metrics.distance_matrix: SSIM and LPIPS as matrix products, the gallery's filtered
moments and features computed once per Gallery); pairs whose fast distance lies within
float32 rounding of the original's are recomputed pair by pair (`_refine`), so ranks and
ties are those of the per-pair definition. A gallery's LPIPS features are kept on disk
between processes (gradleak.metrics.gallery_cache).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from ..leakage import NULL_LINKAGE_VARIANCE
from . import gallery_cache
from .distance_matrix import (
    REFINE_MARGIN,
    SSIM_CACHE_FLOATS,
    l2_matrix,
    lpips_matrix,
    lpips_norms,
    pearson_matrix,
    rows_first,
    ssim_filters,
    ssim_matrix,
    ssim_statistics,
    standardized_rows,
)
from .linkage import linkage_among, null_linkage_variance, rank_and_auc

Distance = Literal["lpips", "ssim", "l2", "l2z", "pearson", "tokens"]
# LPIPS judges images of at least this side, not much longer than wide (it upsamples the
# short side to 64 px: an 8 px digit or a 1 × 2000 strip would be judged on interpolation).
LPIPS_MIN_SIDE = 16
# Comparisons are made this many gallery examples at a time (bounds the memory of the
# LPIPS feature differences: ~60 MB for 28 px images upsampled to 64 px).
CHUNK = 256


@dataclass
class Gallery:
    """Examples of the attacked data's distribution that were not attacked, with where they
    came from in words (`source`) and, when there are fewer than a study wants, why
    (`note`). The same gallery serves every attack and defense of a study."""

    inputs: torch.Tensor
    source: str
    note: str | None = None
    # each example's class (-1: not known), so a reconstruction is linked among its own class's
    # examples (linkage.linkage_among); None when no labels are known
    labels: torch.Tensor | None = None
    _features: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def describe(self) -> str:
        text = f"{len(self):,} {self.source}"
        return f"{text} ({self.note})" if self.note else text


def reid_distances(modality: str, input_shape: tuple[int, ...], lpips: str) -> tuple[Distance, ...]:
    """The distances re-identification uses for this data (module docstring): the modality's."""
    from ..modalities import modality as modality_of

    return modality_of(modality).reid_distances(tuple(input_shape), lpips)


def lpips_reads(input_shape: tuple[int, ...]) -> bool:
    """Whether the LPIPS backbone can read pictures of `input_shape` (C, H, W): one or three
    channels, sides of at least LPIPS_MIN_SIDE, not much longer than wide."""
    return len(input_shape) == 3 and input_shape[0] in (1, 3) and \
        LPIPS_MIN_SIDE <= min(input_shape[1:]) and max(input_shape[1:]) <= 4 * min(input_shape[1:])


def chance_rate(gallery_size: int, distances: int) -> float:
    """The rate at which reconstructions that carry nothing identify their originals, at most."""
    return min(1.0, distances / (gallery_size + 1))


def linkage_distances(distances: tuple[Distance, ...], extra: tuple[Distance, ...] = ()) -> tuple[Distance, ...]:
    """The distances whose linkage AUCs are averaged into an example's `linkage`: the
    identifying `distances` and the modality's `extra` ones (`Modality.linkage_extra`; pictures
    add Pearson). docs/judging.md: each has power on the calibration data; tabular records are
    compared on features standardised by the gallery's spread, so no one feature's units dominate."""
    return tuple(dict.fromkeys(tuple("l2z" if d == "l2" else d for d in distances) + tuple(extra)))


@dataclass
class Judgement:
    """Re-identification of one batch: per example, its rank under each distance (`ranks`:
    gallery examples at least as close to the reconstruction as its original, duplicates of
    the original left out), `rank` the best over the identifying distances, and `linkage`
    the mean over the linkage distances of the fraction of gallery examples strictly
    farther than the original (ties one half; None for an empty gallery)."""

    ranks: list[dict[str, int]]
    rank: list[int]
    linkage: list[float | None]
    aucs: list[dict[str, float]] = field(default_factory=list)  # each linkage distance's AUC
    # each example's linkage under its own permutation null (`null_linkage_variance`)
    null_variance: list[float | None] = field(default_factory=list)


def judge(originals: torch.Tensor, reconstructions: torch.Tensor, gallery: Gallery,
          distances: tuple[Distance, ...], linkage: tuple[Distance, ...] | None = None,
          backbone: str = "alex", pad_token: int | None = None,
          lpips_features: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
          labels: torch.Tensor | None = None) -> Judgement:
    """Re-identify every reconstruction among `gallery` (Judgement). `distances` identify,
    `linkage` (default: `linkage_distances(distances)`) enter the linkage AUC, taken among the
    gallery examples that share the original's label (`labels`, one per original; the gallery's
    own `labels`; linkage.linkage_among) where enough do. A
    reconstruction that is not finite identifies nothing (rank = gallery size under every
    distance) and links at 0.5, as one carrying nothing does. `lpips_features`: the
    reconstructions' and originals' `unit_features` when the caller has them already
    (`unit_features`), so they are not computed twice."""
    linkage = linkage_distances(distances) if linkage is None else linkage
    wanted = tuple(dict.fromkeys(distances + linkage))
    n, size = len(originals), len(gallery)
    if "tokens" in wanted:
        originals, reconstructions = originals.long().cpu(), reconstructions.long().cpu()
        finite = torch.ones(n, dtype=torch.bool)
    else:
        originals = originals.detach().float().cpu()
        reconstructions = reconstructions.detach().float().cpu()
        finite = torch.isfinite(reconstructions.flatten(1)).all(1) if n else torch.ones(0, dtype=torch.bool)
    ranks: list[dict[str, int]] = [{d: size for d in wanted} for _ in range(n)]
    aucs: list[dict[str, float]] = [{d: 0.5 for d in linkage} for _ in range(n)]
    null: list[float | None] = [None] * n
    keep = finite.nonzero().flatten().tolist()
    if size == 0:
        return Judgement([{d: 0 for d in wanted} for _ in range(n)], [0] * n, [None] * n, [{} for _ in range(n)])
    if keep:
        x, r = originals[keep], reconstructions[keep]
        others = gallery.inputs.to(x.dtype)
        duplicate = duplicate_pairs(x, others)
        among = linkage_among(~duplicate, None if labels is None else labels[keep], gallery.labels)
        features = None
        if "lpips" in wanted:
            features = batch_features(r, x, backbone, lpips_features, keep)
        linked = []
        for distance in wanted:
            to_gallery, to_original = fast_distances(r, x, gallery, distance, backbone, pad_token, features)
            to_gallery, to_original = _refine(r, x, gallery, distance, backbone, to_gallery, to_original)
            at_least_as_close, auc = rank_and_auc(to_gallery, to_original, ~duplicate, among)
            if distance in linkage:
                linked.append((to_gallery, to_original))
            for k, i in enumerate(keep):
                ranks[i][distance] = int(at_least_as_close[k])
                if distance in linkage:
                    aucs[i][distance] = float(auc[k])
        if linked:
            for k, v in zip(keep, null_linkage_variance(linked, among).tolist()):
                null[k] = v
    return Judgement(ranks, [min(r[d] for d in distances) for r in ranks],
                     [sum(a.values()) / len(a) if a else 0.5 for a in aucs], aucs, null)


def gallery_ranks(originals: torch.Tensor, reconstructions: torch.Tensor, gallery: Gallery,
                  distances: tuple[Distance, ...], backbone: str = "alex", pad_token: int | None = None) -> list[int]:
    """For each original, how many gallery examples its reconstruction is at least as close
    to as to the original, under the distance that ranks the original best (0: the
    reconstruction identifies it). A reconstruction that is not finite identifies nothing
    (rank = gallery size). `pad_token`: the padding id the token distance leaves out."""
    return judge(originals, reconstructions, gallery, distances, (), backbone, pad_token).rank


def duplicate_pairs(originals: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """(R, G): gallery example g is identical to original r. Only pairs whose random
    projections agree are compared in full."""
    flat_x, flat_g = originals.flatten(1).double(), others.flatten(1).double()
    direction = torch.rand(flat_x.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    key_x, key_g = flat_x @ direction, flat_g @ direction
    candidates = ((key_x[:, None] - key_g[None]).abs() <= 1e-9 * (1 + key_x.abs()[:, None])).nonzero()
    duplicate = torch.zeros(len(flat_x), len(flat_g), dtype=torch.bool)
    for r, g in candidates.tolist():
        duplicate[r, g] = bool(torch.equal(originals[r], others[g]))
    return duplicate


def batch_features(recons, originals, backbone: str, given, keep: list[int]):
    """LPIPS unit features of the kept reconstructions and originals: the caller's, or computed
    (per image they do not depend on the batch they are computed in)."""
    if given is not None:
        return tuple([f[keep] for f in side] for side in given)
    from .lpips import load_lpips

    model = load_lpips(backbone)  # type: ignore[arg-type]
    with torch.no_grad():
        return unit_features(model, recons), unit_features(model, originals)


def fast_distances(recons, originals, gallery: Gallery, distance: str, backbone: str, pad_token, features=None):
    """Fast distances (distance_matrix) of every reconstruction to the gallery and its original."""
    if distance == "tokens":
        to_gallery = torch.stack([token_overlap_distance(r, gallery.inputs.long().cpu(), pad_token) for r in recons])
        to_original = torch.stack([token_overlap_distance(r, x[None], pad_token)[0]
                                   for r, x in zip(recons, originals)])
        return to_gallery, to_original
    if distance == "l2":
        return l2_matrix(recons, originals, gallery.inputs)
    if distance == "l2z":
        return l2_matrix(recons, originals, gallery.inputs, gallery_scale(gallery))
    if distance == "pearson":
        if "pearson" not in gallery._features:  # the gallery's standardised rows, computed once
            gallery._features["pearson"] = standardized_rows(gallery.inputs)
        return pearson_matrix(recons, originals, gallery._features["pearson"])
    if distance == "ssim":
        if "ssim" not in gallery._features:  # the gallery's filtered moments, computed once
            images = rows_first(gallery.inputs)
            keep = 4 * gallery.inputs.numel() <= SSIM_CACHE_FLOATS
            gallery._features["ssim"] = images, (ssim_statistics(images, ssim_filters(tuple(gallery.inputs.shape[1:])))
                                                 if keep else None)
        images, statistics = gallery._features["ssim"]
        return ssim_matrix(recons, originals, images, statistics)
    from .lpips import load_lpips

    model = load_lpips(backbone)  # type: ignore[arg-type]
    with torch.no_grad():
        others, norms = _gallery_lpips(gallery, backbone)
        mine, theirs = features if features is not None else batch_features(recons, originals, backbone, None, [])
        return lpips_matrix(model, mine, theirs, others, norms)


def gallery_scale(gallery: Gallery) -> torch.Tensor:
    """Each feature's spread over the gallery (1 where it does not vary): the unit of `l2z`."""
    flat = gallery.inputs.flatten(1).float()
    spread = flat.std(0) if len(flat) > 1 else torch.ones(flat.shape[1])
    return torch.where(spread > 0, spread, torch.ones_like(spread))


def unit_features(model, images: torch.Tensor) -> list[torch.Tensor]:
    """LPIPS `unit_features` of `images`, CHUNK images at a time."""
    chunks = [model.unit_features(images[i:i + CHUNK]) for i in range(0, len(images), CHUNK)]
    return [torch.cat(layer) for layer in zip(*chunks)]


def gallery_features(gallery: Gallery, backbone: str) -> list[torch.Tensor]:
    return _gallery_lpips(gallery, backbone)[0]


def _gallery_lpips(gallery: Gallery, backbone: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The gallery's LPIPS unit features and their `lpips_norms`, per layer: computed once per
    gallery, kept on the Gallery for the process and on disk for later ones (gallery_cache)."""
    from .lpips import load_lpips

    key = ("lpips", backbone)
    if key not in gallery._features:  # computed once per gallery, then reused by every attack
        kept = gallery_cache.read_kept(gallery.inputs, backbone)
        if kept is None:
            model = load_lpips(backbone)  # type: ignore[arg-type]
            with torch.no_grad():
                features = unit_features(model, gallery.inputs)
                kept = features, lpips_norms(model, features)
            gallery_cache.keep(gallery.inputs, backbone, *kept)
        gallery._features[key] = kept
    return gallery._features[key]


def _refine(recons, originals, gallery: Gallery, distance: str, backbone: str,
            to_gallery: torch.Tensor, to_original: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute by the per-pair reference (`reference_distances`) the distances the fast
    ones cannot order against the original's: pairs within REFINE_MARGIN of it. Each pair's
    LPIPS features are computed afresh, one image at a time: the batch's own features can
    differ from those in the last float bits (convolution kernels depend on the batch size
    on some CPUs), which reorders a near-duplicate of the original."""
    if distance in ("tokens", "l2z"):  # already exact: computed as the reference computes them
        return to_gallery, to_original
    margin = REFINE_MARGIN * to_original.abs().clamp_min(1)
    close = (to_gallery - to_original[:, None]).abs() <= margin[:, None]
    to_gallery, to_original = to_gallery.clone(), to_original.clone()
    for k in close.any(1).nonzero().flatten().tolist():
        columns = close[k].nonzero().flatten()
        to_original[k], to_gallery[k, columns] = _reference_pair(recons[k], originals[k], gallery, columns,
                                                                 distance, backbone)
    return to_gallery, to_original


def token_overlap_distance(sequence: torch.Tensor, others: torch.Tensor, pad_token: int | None) -> torch.Tensor:
    """1 − F-measure of the token-id multiset overlap between `sequence` (T,) and each row of
    `others` (N, T'), padding left out: 0 for the same bag of tokens, 1 for none in common."""
    mine = sequence if pad_token is None else sequence[sequence != pad_token]
    real = torch.ones_like(others, dtype=torch.bool) if pad_token is None else others != pad_token
    common = torch.zeros(others.shape[0], dtype=torch.float64)
    tokens, counts = torch.unique(mine, return_counts=True)
    for token, count in zip(tokens.tolist(), counts.tolist()):
        common += ((others == token) & real).sum(1).clamp_max(count).double()
    total = mine.numel() + real.sum(1).double()
    return 1 - torch.where(total > 0, 2 * common / total.clamp_min(1), torch.zeros_like(total))


def reid_summary(scores: list) -> dict:
    """`reid` (the fraction of judged examples that identify their original), `reid_chance`,
    `gallery` (its size), `linkage` (the mean linkage AUC of the judged examples: 0.5 when
    reconstructions carry nothing) and `recognizable` (the fraction re-identified that also
    pass their modality's perceptual bar), from per-example scores with a `gallery_rank`;
    {} when none was judged."""
    judged = [s for s in scores if s.gallery_rank is not None]
    if not judged:
        return {}
    linked = [s.linkage for s in judged if getattr(s, "linkage", None) is not None]
    return {"reid": sum(bool(s.identified) for s in judged) / len(judged),
            "reid_chance": max(s.reid_chance or 0.0 for s in judged),
            "gallery": min(s.gallery_size or 0 for s in judged),
            "linkage": sum(linked) / len(linked) if linked else None,
            # the spread over examples, so that evidence pools over cells (gradleak.leakage.Evidence)
            "linkage_sd": (sum((v - sum(linked) / len(linked)) ** 2 for v in linked) / (len(linked) - 1)) ** 0.5
            if len(linked) > 1 else (0.0 if linked else None),
            # the mean over those examples of each one's null variance (1/12 where none was kept)
            "linkage_null_var": sum(v if v is not None else NULL_LINKAGE_VARIANCE for v in
                                    (getattr(s, "linkage_null_var", None) for s in judged
                                     if getattr(s, "linkage", None) is not None)) / len(linked) if linked else None,
            "recognizable": sum(bool(getattr(s, "recognizable", False)) for s in judged) / len(judged)}


def _reference_pair(recon: torch.Tensor, original: torch.Tensor, gallery: Gallery, columns: torch.Tensor,
                    distance: str, backbone: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Distances from one reconstruction to its original and to the gallery examples `columns`,
    computed per pair as the definition reads (`reference_distances`)."""
    if distance != "lpips":  # one call: each pair's distance does not depend on the others
        values = reference_distances(recon, torch.cat([original[None], gallery.inputs[columns].float()]),
                                      distance, backbone)
        return values[0], values[1:]
    from .lpips import load_lpips

    model = load_lpips(backbone)  # type: ignore[arg-type]
    with torch.no_grad():
        mine, theirs = model.unit_features(recon[None]), model.unit_features(original[None])
        return (model.feature_distance(mine, theirs)[0],
                model.feature_distance(mine, [f[columns] for f in gallery_features(gallery, backbone)]))


def reference_distances(recon: torch.Tensor, others: torch.Tensor, distance: Distance, backbone: str) -> torch.Tensor:
    """Distance from one reconstruction to each of `others`."""
    if distance == "l2":
        return (others - recon).flatten(1).pow(2).sum(1)
    if distance == "pearson":  # in float64, as the reference the fast float32 product is checked by
        mine, theirs = recon.flatten().double(), others.flatten(1).double()
        mine, theirs = mine - mine.mean(), theirs - theirs.mean(1, keepdim=True)
        norms = mine.norm() * theirs.norm(dim=1)
        return torch.where(norms > 0, 1 - theirs @ mine / norms.clamp_min(1e-300), torch.ones_like(norms)).float()
    if distance == "ssim":
        from .image import ssim

        return 1 - ssim(recon[None].expand_as(others).clamp(0, 1), others)
    from .lpips import load_lpips

    model = load_lpips(backbone)  # type: ignore[arg-type]
    with torch.no_grad():
        return model.feature_distance(model.unit_features(recon[None]), model.unit_features(others))
