"""Distances of many reconstructions to a whole gallery at once (gradleak.metrics.reidentify).

Comparing each reconstruction with each gallery example one pair at a time made judging
most of a run (docs/judging.md); here each distance is a few large tensor operations, in
float32:

* SSIM: SSIM's Gaussian filter is linear and separable, so it is two matrix products (one
  per image axis). A gallery's filtered means and second moments are computed once and kept
  on the Gallery; per pair only the filtered product x·y is new, and the SSIM map follows
  from the same formula as pytorch_msssim's.
* LPIPS: each layer's term Σ_c w_c (a_c − b_c)² averaged over positions expands to
  |a|²_w + |b|²_w − 2⟨w·a, b⟩: a matrix product between the reconstructions' and the
  gallery's unit-normalised features (the gallery's computed once per Gallery).
* L2: broadcast differences.
* Pearson: 1 − the correlation of two images' pixels, a matrix product between rows centred and
  scaled to unit norm (the gallery's computed once per Gallery).

These are fast, not bit-identical to the per-pair computation (float32 instead of SSIM's
float64, a dot-product expansion instead of differences): `reidentify` recomputes exactly,
by the per-pair reference, every pair whose fast distance lies within
`REFINE_MARGIN` of the original's, so ranks and ties are the reference's.
"""
from __future__ import annotations

import functools

import torch

# Pairs whose fast distance lies closer than this (relative to the larger of 1 and the
# distance) to the original's are recomputed exactly: fifty times the fast distances' largest
# error seen (docs/judging.md; tests/metrics/test_reidentify.py checks a tenth of it).
REFINE_MARGIN = 1e-5
# Floats held by one block of differences (L2): 16M = 64 MB.
BLOCK_FLOATS = 1 << 24
# A gallery's SSIM moments are kept (on the Gallery) up to this many floats (64M = 256 MB); a
# larger gallery's are recomputed block by block at each call instead.
SSIM_CACHE_FLOATS = 1 << 26
# Floats of one block of per-pair SSIM maps: 512K = 2 MB, small enough to stay in cache
# through the dozen element-wise passes of SSIM's formula.
SSIM_BLOCK_FLOATS = 1 << 19
_K1, _K2 = 0.01, 0.03


def _band(side: int, window: torch.Tensor) -> torch.Tensor:
    """(side', side) matrix of a 'valid' 1-D filter; the identity where the window does not fit
    (pytorch_msssim skips that axis)."""
    taps = window.numel()
    if side < taps:
        return torch.eye(side)
    band = torch.zeros(side - taps + 1, side)
    for i in range(band.shape[0]):
        band[i, i:i + taps] = window
    return band


@functools.lru_cache(maxsize=16)  # read only by _filter; built from a Python loop
def ssim_filters(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, H') and (W, W') matrices of image.ssim's Gaussian window for (C, H, W) images."""
    from pytorch_msssim.ssim import _fspecial_gauss_1d

    sides = [side for side in shape[-2:] if side >= 3] or [1]
    side = min(sides)
    win = min(11, side if side % 2 == 1 else side - 1)
    window = _fspecial_gauss_1d(win, 1.5).flatten()
    return _band(shape[-2], window).T.contiguous(), _band(shape[-1], window).T.contiguous()


def _filter(images: torch.Tensor, filters: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Gaussian-filter images laid out (H, ..., W): (H', ..., W'). Rows lead so that both
    passes are single matrix products, with no transposed copy between them."""
    along_h, along_w = filters
    h, *lead, w = images.shape
    out = images.reshape(-1, w) @ along_w
    return (along_h.T @ out.reshape(h, -1)).reshape(along_h.shape[1], *lead, along_w.shape[1])


def rows_first(images: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) images as (H, N, C, W) in [0, 1] (clamped), float32: the layout `_filter` takes."""
    return images.float().clamp(0, 1).permute(2, 0, 1, 3).contiguous()


def ssim_statistics(images: torch.Tensor, filters) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Filtered mean, squared mean and variance maps, (H', N, C, W'), of `rows_first` images."""
    mu = _filter(images, filters)
    mu_sq = mu * mu
    return mu, mu_sq, _filter(images * images, filters) - mu_sq


def _ssim_from(e12, mu1, mu2, stats1, stats2) -> torch.Tensor:
    """SSIM per pair (its map's mean over positions, then channels) from the filtered product
    e12 and each side's statistics (broadcast), by pytorch_msssim's formula."""
    c1, c2 = _K1 ** 2, _K2 ** 2
    mu12 = mu1 * mu2
    cs = e12.sub_(mu12).mul_(2).add_(c2).div_(stats1[2] + stats2[2] + c2)
    luminance = mu12.mul_(2).add_(c1).div_(stats1[1] + stats2[1] + c1)
    return cs.mul_(luminance).mean(dim=(0, -1)).mean(-1)


def ssim_matrix(recons: torch.Tensor, originals: torch.Tensor, others: torch.Tensor,
                other_stats) -> tuple[torch.Tensor, torch.Tensor]:
    """1 − SSIM of each reconstruction to each of `others` (R, G) and to its original (R,).
    `others` is `rows_first`; `other_stats` its `ssim_statistics` (None: computed block by block)."""
    filters = ssim_filters(tuple(recons.shape[1:]))
    recons, originals = rows_first(recons), rows_first(originals)
    mine, theirs = ssim_statistics(recons, filters), ssim_statistics(originals, filters)
    to_original = 1 - _ssim_from(_filter(recons * originals, filters), mine[0], theirs[0], mine, theirs)
    per_pair = recons[:, 0].numel()
    columns = min(others.shape[1], max(1, SSIM_BLOCK_FLOATS // per_pair))
    rows = max(1, SSIM_BLOCK_FLOATS // (per_pair * columns))
    out = torch.empty(recons.shape[1], others.shape[1])
    for j in range(0, others.shape[1], columns):
        g = slice(j, j + columns)
        theirs_g = others[:, g][:, None]
        block = other_stats if other_stats is not None else ssim_statistics(others[:, g], filters)
        stats2 = tuple((s if other_stats is None else s[:, g])[:, None] for s in block)
        for i in range(0, recons.shape[1], rows):
            r = slice(i, i + rows)
            stats1 = tuple(s[:, r][:, :, None] for s in mine)
            e12 = _filter(recons[:, r][:, :, None] * theirs_g, filters)
            out[r, g] = 1 - _ssim_from(e12, stats1[0], stats2[0], stats1, stats2)
    return out, to_original


def lpips_norms(model, features: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per layer, each image's Σ_c w_c |f_c|² over positions: the |b|²_w of `lpips_matrix`."""
    return [((f * lin.weight.reshape(1, -1, 1, 1)).flatten(1) * f.flatten(1)).sum(1)
            for f, lin in zip(features, model.lins)]


def lpips_matrix(model, recon_features: list[torch.Tensor], original_features: list[torch.Tensor],
                 other_features: list[torch.Tensor], other_norms: list[torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """LPIPS of each reconstruction to each of `others` (R, G) and to its original (R,), from
    unit-normalised features (LPIPS.unit_features); `other_norms`: `lpips_norms` of `others`."""
    other_norms = other_norms if other_norms is not None else lpips_norms(model, other_features)
    to_others = torch.zeros(recon_features[0].shape[0], other_features[0].shape[0])
    to_original = torch.zeros(recon_features[0].shape[0])
    for mine, theirs, other, other_sq, lin in zip(recon_features, original_features, other_features, other_norms,
                                                  model.lins):
        positions = mine.shape[-1] * mine.shape[-2]
        weighted = (mine * lin.weight.reshape(1, -1, 1, 1)).flatten(1)
        mine_sq = (weighted * mine.flatten(1)).sum(1)
        cross = weighted @ other.flatten(1).T
        to_others += (mine_sq[:, None] + other_sq[None] - 2 * cross).clamp_min(0) / positions
        theirs_sq = ((theirs * lin.weight.reshape(1, -1, 1, 1)).flatten(1) * theirs.flatten(1)).sum(1)
        to_original += (mine_sq + theirs_sq - 2 * (weighted * theirs.flatten(1)).sum(1)).clamp_min(0) / positions
    return to_others, to_original


def standardized_rows(images: torch.Tensor) -> torch.Tensor:
    """Each image's pixels as one row, centred and scaled to unit norm (a constant image: zeros,
    correlated with nothing)."""
    rows = images.flatten(1).float()
    rows = rows - rows.mean(1, keepdim=True)
    norms = rows.norm(dim=1, keepdim=True)
    return torch.where(norms > 0, rows / norms.clamp_min(1e-12), torch.zeros_like(rows))


def pearson_matrix(recons: torch.Tensor, originals: torch.Tensor, others: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """1 − Pearson correlation of each reconstruction's pixels with each of `others` (R, G) and
    with its original's (R,); `others` is `standardized_rows`."""
    mine = standardized_rows(recons)
    return 1 - mine @ others.T, 1 - (mine * standardized_rows(originals)).sum(1)


def l2_matrix(recons: torch.Tensor, originals: torch.Tensor, others: torch.Tensor,
              scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared Euclidean distance of each reconstruction to each of `others` (R, G) and to its
    original (R,); features divided by `scale` first when given."""
    recons, originals, others = recons.flatten(1).float(), originals.flatten(1).float(), others.flatten(1).float()
    if scale is not None:
        recons, originals, others = recons / scale, originals / scale, others / scale
    rows = max(1, BLOCK_FLOATS // max(1, others.numel()))
    out = torch.cat([(others[None] - recons[i:i + rows, None]).pow(2).sum(-1)
                     for i in range(0, len(recons), rows)]) if len(recons) else torch.zeros(0, len(others))
    return out, (originals - recons).pow(2).sum(1)
