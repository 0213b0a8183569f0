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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

Distance = Literal["lpips", "ssim", "l2", "tokens"]
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
    _features: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def describe(self) -> str:
        text = f"{len(self):,} {self.source}"
        return f"{text} ({self.note})" if self.note else text


def reid_distances(modality: str, input_shape: tuple[int, ...], lpips: str) -> tuple[Distance, ...]:
    """The distances re-identification uses for this data (module docstring)."""
    from ..data.modality import modality as modality_of

    kind = modality_of(modality)
    if kind.tokens:
        return ("tokens",)
    if not kind.pixels:
        return ("l2",)
    if lpips != "none" and len(input_shape) == 3 and input_shape[0] in (1, 3) and \
            LPIPS_MIN_SIDE <= min(input_shape[1:]) and max(input_shape[1:]) <= 4 * min(input_shape[1:]):
        return ("ssim", "lpips")
    return ("ssim",)


def chance_rate(gallery_size: int, distances: int) -> float:
    """The rate at which reconstructions that carry nothing identify their originals, at most."""
    return min(1.0, distances / (gallery_size + 1))


def gallery_ranks(originals: torch.Tensor, reconstructions: torch.Tensor, gallery: Gallery,
                  distances: tuple[Distance, ...], backbone: str = "alex", pad_token: int | None = None) -> list[int]:
    """For each original, how many gallery examples its reconstruction is at least as close
    to as to the original, under the distance that ranks the original best (0: the
    reconstruction identifies it). A reconstruction that is not finite identifies nothing
    (rank = gallery size). `pad_token`: the padding id the token distance leaves out."""
    if "tokens" in distances:
        return _token_ranks(originals, reconstructions, gallery, pad_token)
    originals = originals.detach().float().cpu()
    reconstructions = reconstructions.detach().float().cpu()
    ranks = []
    for original, recon in zip(originals, reconstructions):
        if not bool(torch.isfinite(recon).all()):
            ranks.append(len(gallery))
            continue
        if len(gallery) == 0:
            ranks.append(0)
            continue
        duplicate = (gallery.inputs - original).flatten(1).abs().amax(1) == 0
        best = len(gallery)
        for distance in distances:
            to_original = float(_distances(recon, original[None], distance, backbone)[0])
            to_gallery = _gallery_distances(recon, gallery, distance, backbone)
            best = min(best, int(((to_gallery <= to_original) & ~duplicate).sum()))
        ranks.append(best)
    return ranks


def _token_ranks(originals: torch.Tensor, recovered: torch.Tensor, gallery: Gallery, pad_token: int | None
                 ) -> list[int]:
    others = gallery.inputs.long().cpu()
    ranks = []
    for original, recon in zip(originals.long().cpu(), recovered.long().cpu()):
        duplicate = (others == original).all(1)
        to_original = float(token_overlap_distance(recon, original[None], pad_token)[0])
        to_gallery = token_overlap_distance(recon, others, pad_token)
        ranks.append(int(((to_gallery <= to_original) & ~duplicate).sum()))
    return ranks


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
    """`reid` (the fraction of judged examples that identify their original), `reid_chance`
    and `gallery` (its size), from per-example scores with a `gallery_rank`; {} when none
    was judged."""
    judged = [s for s in scores if s.gallery_rank is not None]
    if not judged:
        return {}
    return {"reid": sum(bool(s.identified) for s in judged) / len(judged),
            "reid_chance": max(s.reid_chance or 0.0 for s in judged),
            "gallery": min(s.gallery_size or 0 for s in judged)}


def _gallery_distances(recon: torch.Tensor, gallery: Gallery, distance: Distance, backbone: str) -> torch.Tensor:
    if distance != "lpips":
        return torch.cat([_distances(recon, gallery.inputs[i:i + CHUNK], distance, backbone)
                          for i in range(0, len(gallery), CHUNK)])
    from .lpips import load_lpips

    model = load_lpips(backbone)  # type: ignore[arg-type]
    key = ("lpips", backbone)
    with torch.no_grad():
        if key not in gallery._features:  # computed once per gallery, then reused by every attack
            chunks = [model.unit_features(gallery.inputs[i:i + CHUNK]) for i in range(0, len(gallery), CHUNK)]
            gallery._features[key] = [torch.cat(layer) for layer in zip(*chunks)]
        mine = model.unit_features(recon[None])
        features = gallery._features[key]
        return torch.cat([model.feature_distance(mine, [f[i:i + CHUNK] for f in features])
                          for i in range(0, len(gallery), CHUNK)])


def _distances(recon: torch.Tensor, others: torch.Tensor, distance: Distance, backbone: str) -> torch.Tensor:
    """Distance from one reconstruction to each of `others`."""
    if distance == "l2":
        return (others - recon).flatten(1).pow(2).sum(1)
    if distance == "ssim":
        from .image import ssim

        return 1 - ssim(recon[None].expand_as(others).clamp(0, 1), others)
    from .lpips import load_lpips

    model = load_lpips(backbone)  # type: ignore[arg-type]
    with torch.no_grad():
        return model.feature_distance(model.unit_features(recon[None]), model.unit_features(others))
