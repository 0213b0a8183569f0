"""Matching a reconstruction to the batch it came from, and scoring it.

Batch order is not identifiable from an update, so reconstructions are first
assigned to originals by the Hungarian algorithm on per-pair MSE — the
permutation-invariant distance of Liu et al. (Eq. 2) — and only then scored.

Attack success (ASR, Wei et al.): CPL calls a reconstruction successful when the
attack converges to the private example. We score that against ground truth:
an example counts as reconstructed when its matched reconstruction has
MSE ≤ 1e-3 (PSNR ≥ 30 dB for [0, 1] inputs), the level at which CPL's converged
reconstructions (gradient distance ≤ 1e-4) are visually identical to the
originals. ASR is the fraction of the batch's examples that are reconstructed.

Aggregates (`summarize`) count every example, including one the attack returned
nothing for (scored against an all-zero image). The headline PSNR is the PSNR of
the mean MSE, not the mean of per-image PSNRs: PSNR is logarithmic, so one exact
copy at the 100 dB cap would otherwise hide a failed image (a batch of one copy
and one image at MSE 0.2 averages to 53.5 dB; its mean MSE reads 10 dB). The
median and the range of the per-image PSNRs come alongside.

Given a gallery of other examples of the same distribution (`reidentify.Gallery`), each
reconstruction is also asked whether it re-identifies its original among them
(`gallery_rank` 0; `gallery_ranks` under each distance), how strongly it links to it
(`linkage`, the AUC of telling the original from the gallery: 0.5 carries nothing) and
whether it is `recognizable` (re-identified and past the RECOGNIZABLE_* bar);
`summarize` reports the rates with the chance level and the mean linkage (docs/judging.md).

Token sequences (gradleak.modalities.text) are scored by gradleak.metrics.text instead:
ROUGE, token and exact-sequence accuracy, ASR = exact. `score_batch` asks the modality,
which names its scorer, and `summarize` reads the scores it gets, so callers need not.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import mean, median
from typing import Literal

import torch
from scipy.optimize import linear_sum_assignment

from ..modalities import Modality
from ..modalities import modality as modality_of
from .image import mse, psnr, psnr_from_mse, ssim
from .reidentify import (
    Gallery,
    chance_rate,
    gallery_scale,
    judge,
    linkage_distances,
    reid_summary,
    unit_features,
)

ASR_MSE_THRESHOLD = 1e-3
# Perceptual bars of `recognizable` (calibrated on LFW, sklearn digits and skimage/sklearn/
# ImageNet-sample photos, never on the reported MNIST/CIFAR-10: docs/judging.md). An image
# passes with SSIM to its original at least RECOGNIZABLE_SSIM or LPIPS at most
# RECOGNIZABLE_LPIPS; a tabular record with an RMSE, in units of each feature's gallery
# spread, of at most RECOGNIZABLE_TABULAR_Z.
RECOGNIZABLE_SSIM = 0.3
RECOGNIZABLE_LPIPS = 0.15
RECOGNIZABLE_TABULAR_Z = 0.3


@dataclass
class ExampleScore:
    index: int  # position of the original in the attacked batch
    label: int
    recovered_label: int | None
    mse: float
    rmse: float
    psnr: float | None
    ssim: float | None
    lpips: float | None
    success: bool
    matched: bool = True  # False: the attack returned no reconstruction for this example
    # gallery examples at least as close to the reconstruction as its original (0: re-identified);
    # None without a gallery
    gallery_rank: int | None = None
    gallery_size: int | None = None
    reid_chance: float | None = None
    # the rank under each distance ({"ssim": 0, "lpips": 3}); gallery_rank is their minimum
    gallery_ranks: dict[str, int] | None = None
    # linkage AUC in [0, 1]: the fraction of the gallery strictly farther from the reconstruction
    # than its original (ties half), averaged over the linkage distances; 0.5 carries nothing
    linkage: float | None = None
    # the variance of `linkage` under this example's permutation null (linkage.null_linkage_variance)
    linkage_null_var: float | None = None
    # re-identified and past the modality's perceptual bar (RECOGNIZABLE_*); None without a gallery
    recognizable: bool | None = None
    # tabular records: the RMSE in units of each feature's spread over the gallery
    rmse_z: float | None = None

    @property
    def identified(self) -> bool | None:
        return None if self.gallery_rank is None else self.gallery_rank == 0

    def to_dict(self) -> dict:
        return {**asdict(self), "identified": self.identified}


def match_reconstruction(originals: torch.Tensor, candidates: torch.Tensor) -> list[int | None]:
    """For each original, the index of its matched candidate (None if there are
    fewer candidates than originals)."""
    cost = torch.cdist(originals.flatten(1).double(), candidates.flatten(1).double()).pow(2)
    rows, cols = linear_sum_assignment(cost.numpy())
    assignment: list[int | None] = [None] * originals.shape[0]
    for r, c in zip(rows, cols):
        assignment[r] = int(c)
    return assignment


def score_batch(originals: torch.Tensor, labels: torch.Tensor, reconstruction: torch.Tensor,
                recovered_labels: torch.Tensor | None, modality: str,
                lpips: Literal["alex", "vgg", "none"] = "alex",
                asr_mse: float = ASR_MSE_THRESHOLD, gallery: Gallery | None = None,
                tokenizer: str | None = "gpt2") -> tuple[list, torch.Tensor]:
    """Per-example scores of one attacked batch after Hungarian matching, and the
    reconstruction reordered to the originals (zeros where nothing matched); with a
    `gallery`, whether each reconstruction re-identifies its original among it. The modality
    scores its batches its own way (`Modality.score`: pictures and feature rows here, token
    sequences by gradleak.metrics.text into `SequenceScore`s)."""
    return modality_of(modality).score(originals, labels, reconstruction, recovered_labels, lpips=lpips,
                                       asr_mse=asr_mse, gallery=gallery, tokenizer=tokenizer)


def score_pictures(originals: torch.Tensor, labels: torch.Tensor, reconstruction: torch.Tensor,
                   recovered_labels: torch.Tensor | None, kind: Modality,
                   lpips: Literal["alex", "vgg", "none"] = "alex", asr_mse: float = ASR_MSE_THRESHOLD,
                   gallery: Gallery | None = None) -> tuple[list, torch.Tensor]:
    """`score_batch` for pictures: MSE with PSNR, SSIM and LPIPS, re-identified as pictures."""
    return _score_arrays(originals, labels, reconstruction, recovered_labels, kind, lpips, asr_mse, gallery,
                         image=True)


def score_features(originals: torch.Tensor, labels: torch.Tensor, reconstruction: torch.Tensor,
                   recovered_labels: torch.Tensor | None, kind: Modality,
                   lpips: Literal["alex", "vgg", "none"] = "alex", asr_mse: float = ASR_MSE_THRESHOLD,
                   gallery: Gallery | None = None) -> tuple[list, torch.Tensor]:
    """`score_batch` for float inputs other than pictures (feature rows): MSE alone, and
    re-identified on features standardised by the gallery's spread."""
    return _score_arrays(originals, labels, reconstruction, recovered_labels, kind, lpips, asr_mse, gallery,
                         image=False)


def _score_arrays(originals: torch.Tensor, labels: torch.Tensor, reconstruction: torch.Tensor,
                  recovered_labels: torch.Tensor | None, kind: Modality, lpips: Literal["alex", "vgg", "none"],
                  asr_mse: float,
                  gallery: Gallery | None, image: bool) -> tuple[list, torch.Tensor]:
    originals = originals.detach().float().cpu()
    candidates = reconstruction.detach().float().cpu()
    if candidates.shape[1:] != originals.shape[1:]:
        raise ValueError(f"reconstruction shape {tuple(candidates.shape[1:])} does not match "
                         f"the data shape {tuple(originals.shape[1:])}")
    candidates = kind.clamp(candidates)
    # A reconstruction with NaN or infinite values (an attack that divided by a zeroed update,
    # say) reconstructs nothing: it is left out of the matching, and its example is scored
    # as unreconstructed.
    candidates = candidates[torch.isfinite(candidates.flatten(1)).all(1)]
    assignment = match_reconstruction(originals, candidates) if len(candidates) else [None] * len(originals)
    matched = [i for i, c in enumerate(assignment) if c is not None]
    x = originals[matched]
    r = candidates[[assignment[i] for i in matched]]
    per = {}
    features = None
    if matched:
        per["mse"] = mse(x, r)
        if image:
            per["psnr"] = psnr(x, r)
            per["ssim"] = ssim(x, r)
            if lpips != "none":
                # LPIPS from features kept for re-identification, which compares the same images
                from .lpips import load_lpips
                model = load_lpips(lpips)
                with torch.no_grad():
                    # each image's features once: every candidate's (the candidate-set judge
                    # compares all of them; identical ones, as a malicious attack's repeated
                    # bins are, computed once), then the matched ones picked out
                    from .candidate_set import distinct_rows

                    first, inverse = distinct_rows(candidates)
                    distinct_features = unit_features(model, candidates[first])
                    picked = inverse[torch.tensor([assignment[i] for i in matched], dtype=torch.long)]
                    features = [f[picked] for f in distinct_features], unit_features(model, x)
                    per["lpips"] = model.feature_distance(*features)
    scores = []
    for i in range(originals.shape[0]):
        label = int(labels[i])
        if i in matched:
            k = matched.index(i)
            m = float(per["mse"][k])
            scores.append(ExampleScore(
                index=i, label=label, recovered_label=None, mse=m, rmse=m ** 0.5,
                psnr=float(per["psnr"][k]) if image else None,
                ssim=float(per["ssim"][k]) if image else None,
                lpips=float(per["lpips"][k]) if "lpips" in per else None,
                success=m <= asr_mse))
        else:
            # Nothing reconstructed for this example: scored as an all-zero reconstruction
            # (SSIM 0, LPIPS 1), so every mean counts it instead of leaving it out.
            m = float(originals[i].pow(2).mean())
            no_psnr = psnr_from_mse(m) if image else None
            scores.append(ExampleScore(i, label, None, m, m ** 0.5, no_psnr, 0.0 if image else None,
                                     1.0 if image and lpips != "none" else None, False, matched=False))
    _assign_labels_by_count(scores, recovered_labels)
    aligned = torch.zeros_like(originals)
    for i in matched:
        aligned[i] = candidates[assignment[i]]
    if gallery is not None:
        distances = kind.reid_distances(tuple(originals.shape[1:]), lpips)
        linkage = linkage_distances(distances, kind.linkage_extra)
        if len(candidates) > 1:  # matched with the ground truth: the gallery gets the same choice
            from .candidate_set import judge_candidates

            # with LPIPS, the distinct candidates with their features (the judge needs no others)
            verdict = judge_candidates(originals[matched], candidates if features is None else candidates[first],
                                       gallery, distances, backbone=lpips if lpips != "none" else "alex",
                                       lpips_features=None if features is None else
                                       (distinct_features, features[1]), linkage=linkage,
                                       labels=torch.as_tensor(labels)[matched], others_claim=True)
        else:
            verdict = judge(originals[matched], aligned[matched], gallery, distances, linkage,
                            backbone=lpips if lpips != "none" else "alex", lpips_features=features,
                            labels=torch.as_tensor(labels)[matched])
        scale = None if image or not len(gallery) else gallery_scale(gallery)
        for s in scores:
            s.gallery_size, s.reid_chance = len(gallery), chance_rate(len(gallery), len(distances))
            if s.matched:
                k = matched.index(s.index)
                s.gallery_rank, s.gallery_ranks, s.linkage = verdict.rank[k], verdict.ranks[k], verdict.linkage[k]
                s.linkage_null_var = verdict.null_variance[k] if verdict.null_variance else None
            else:  # nothing returned: identifies nothing, links as chance does
                s.gallery_rank = len(gallery)
                s.gallery_ranks = dict.fromkeys(distances + linkage, len(gallery))
                s.linkage = 0.5 if len(gallery) else None
            if scale is not None:
                s.rmse_z = float(((aligned[s.index] - originals[s.index]).flatten() / scale).pow(2).mean().sqrt())
            s.recognizable = bool(s.identified) and s.matched and passes_bar(s)
    return scores, aligned


def passes_bar(score: ExampleScore) -> bool:
    """Whether a reconstruction looks enough like its original for a person to recognise it
    (the RECOGNIZABLE_* bars; docs/judging.md)."""
    if score.ssim is not None:
        return score.ssim >= RECOGNIZABLE_SSIM or (score.lpips is not None and score.lpips <= RECOGNIZABLE_LPIPS)
    if score.rmse_z is not None:
        return score.rmse_z <= RECOGNIZABLE_TABULAR_Z
    return True


def _assign_labels_by_count(scores: list[ExampleScore], recovered: torch.Tensor | None) -> None:
    """Label accuracy is judged on the multiset: an example's label counts as
    recovered if its class is still available among the recovered labels."""
    if recovered is None:
        return
    pool = [int(v) for v in recovered]
    for s in scores:
        s.recovered_label = s.label if s.label in pool else (pool[0] if pool else None)
        if s.label in pool:
            pool.remove(s.label)
        elif pool:
            pool.pop(0)


def summarize(scores: list) -> dict:
    """Aggregates over all attacked examples, with the key names of the CLI contract.

    mse, rmse, ssim, lpips: means. psnr: the PSNR of the mean MSE (a failed image
    pulls it down to near its own level). psnr_median, psnr_min, psnr_max: the
    per-image PSNRs' median and range. label_acc: recovered labels as a multiset.
    asr: fraction with MSE at most the ASR threshold. matched: fraction the
    attack returned a reconstruction for (0: it reconstructed nothing). With a gallery:
    reid, the fraction that re-identify their original; reid_chance, the rate chance gives;
    gallery, its size. examples: how many examples were scored. Scores of token sequences
    are summarised by `metrics.text.summarize_sequences`."""
    from .text import SequenceScore, summarize_sequences

    if scores and isinstance(scores[0], SequenceScore):
        return summarize_sequences(scores)

    def avg(key):
        values = [getattr(s, key) for s in scores if getattr(s, key) is not None]
        return float(mean(values)) if values else None

    psnrs = [s.psnr for s in scores if s.psnr is not None]
    mean_mse = avg("mse")
    labelled = [s for s in scores if s.recovered_label is not None]
    return {
        "mse": mean_mse,
        "rmse": avg("rmse"),
        # PSNR is defined for image data only: per-image PSNRs are None otherwise.
        "psnr": psnr_from_mse(mean_mse) if psnrs and mean_mse is not None else None,
        "psnr_median": float(median(psnrs)) if psnrs else None,
        "psnr_min": float(min(psnrs)) if psnrs else None,
        "psnr_max": float(max(psnrs)) if psnrs else None,
        "ssim": avg("ssim"),
        "lpips": avg("lpips"),
        "label_acc": (sum(s.recovered_label == s.label for s in labelled) / len(labelled)) if labelled else None,
        "asr": sum(s.success for s in scores) / len(scores) if scores else None,
        "matched": sum(s.matched for s in scores) / len(scores) if scores else None,
        "examples": len(scores),
        **reid_summary(scores),
    }


