"""Blind source separation of a linear layer's weight gradient (Cocktail Party Attack, Kariyappa
et al. ICML 2023).

∂L/∂W = Δ X (m × d): every row is a mixture of the B inputs. Treating the d input coordinates as
observations, the B inputs are independent, non-Gaussian "sources": centre, whiten to B
components (SVD), then find the unmixing by FastICA (log-cosh negentropy with symmetric
decorrelation, scikit-learn), optionally refined with a total-variation prior for images.
Each unmixed row is a combination w_kᵀ ∂L/∂W = α_k x_k of gradient rows; with a bias gradient the
same combination gives w_kᵀ ∂L/∂b = α_k, which removes sign and scale exactly.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy.optimize import linprog
from sklearn.decomposition import FastICA

from ..errors import GradleakError


def _negentropy(y: torch.Tensor) -> torch.Tensor:
    """Hyvärinen's log-cosh negentropy proxy per row of standardised y."""
    gauss = 0.3745672075  # E log cosh(z), z ~ N(0, 1)
    return (torch.log(torch.cosh(y)).mean(1) - gauss) ** 2


def _tv(images: torch.Tensor) -> torch.Tensor:
    return ((images[..., 1:, :] - images[..., :-1, :]).abs().mean((-1, -2))
            + (images[..., :, 1:] - images[..., :, :-1]).abs().mean((-1, -2)))


def unmix_gradient(g_weight: torch.Tensor, sources: int, *, image_shape: tuple[int, ...] | None = None,
                   tv: float = 0.0, refine_steps: int = 0, seed: int = 0, nonnegative: bool = False,
                   starts: int = 6) -> torch.Tensor:
    """Row combinations (sources, m) whose products with g_weight are the separated inputs.

    `nonnegative` (inputs known to be ≥ 0, e.g. images in [0, 1]) adds a sparse non-negative
    component search seeded by the ICA solution: each ICA direction and `starts`·B random ones are
    pushed to a vertex of {w : wᵀZ ≥ 0} by the LP  min 1ᵀZᵀw s.t. Zᵀw ≥ 0, ⟨w, u⟩ = 1, i.e. to
    the sparsest non-negative signal in the span (the non-Gaussianity prior taken to its limit for
    sparse images); the B vertices reached most often are kept.
    """
    G = g_weight.detach().double()
    m, d = G.shape
    if not 1 <= sources <= min(m, d):
        raise GradleakError(f"cpa: cannot separate {sources} inputs from a {m}×{d} gradient "
                            f"(the layer needs at least as many units as the batch size)")
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    keep = S[:sources].clamp_min(S[0] * 1e-12)
    Z = Vh[:sources]  # (B, d) orthonormal rows spanning the inputs
    to_rows = U[:, :sources].T / keep[:, None]  # to_rows @ G = Z
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FastICA convergence warnings: the refinement follows
        ica = FastICA(n_components=sources, whiten="unit-variance", fun="logcosh", max_iter=1000,
                      tol=1e-5, random_state=seed)
        ica.fit(Z.T.numpy())
    unmix = torch.from_numpy(np.asarray(ica.components_, dtype=np.float64))  # (B, B): y = unmix (z − z̄)
    if refine_steps and tv > 0 and image_shape is not None:
        unmix = _refine_tv(unmix, Z, image_shape, tv, refine_steps)
    if nonnegative:
        unmix = _nonnegative_vertices(Z, unmix, starts, seed)
    return unmix @ to_rows


def _nonnegative_vertices(Z: torch.Tensor, init: torch.Tensor, starts: int, seed: int) -> torch.Tensor:
    Zn = Z.numpy()
    B, d = Zn.shape
    rng = np.random.default_rng(seed)
    directions = np.concatenate([init.numpy(), -init.numpy(), rng.standard_normal((starts * B, B))])
    found: list[np.ndarray] = []
    for u in directions:
        res = linprog(Zn.sum(1), A_ub=-Zn.T, b_ub=np.zeros(d), A_eq=u[None], b_eq=[1.0],
                      bounds=[(None, None)] * B, method="highs")
        if res.status == 0:
            found.append(res.x)
    if not found:
        return init
    cand = np.array(found)
    signals = cand @ Zn
    signals /= np.linalg.norm(signals, axis=1, keepdims=True).clip(1e-300)
    reps: list[int] = []
    counts: list[int] = []
    for i, sig in enumerate(signals):
        for j, r in enumerate(reps):
            if sig @ signals[r] > 0.999:
                counts[j] += 1
                break
        else:
            reps.append(i)
            counts.append(1)
    order = np.argsort(-np.array(counts), kind="stable")[:B]
    chosen = cand[[reps[o] for o in order]]
    if len(chosen) < B:  # fewer distinct vertices than inputs: fill with ICA directions
        chosen = np.concatenate([chosen, init.numpy()[: B - len(chosen)]])
    return torch.from_numpy(chosen)


def _refine_tv(unmix: torch.Tensor, Z: torch.Tensor, image_shape: tuple[int, ...], tv: float,
               steps: int) -> torch.Tensor:
    """CPA objective: −negentropy + tv·TV + decorrelation penalty, from the FastICA solution."""
    Zc = Z - Z.mean(1, keepdim=True)
    M = unmix.clone().requires_grad_(True)
    opt = torch.optim.Adam([M], lr=1e-3 * float(unmix.abs().mean()))
    B = M.shape[0]
    for _ in range(steps):
        opt.zero_grad()
        Y = M @ Zc
        Y = Y / Y.std(1, keepdim=True).clamp_min(1e-12)
        decor = ((Y @ Y.T) / Y.shape[1] - torch.eye(B, dtype=Y.dtype)).pow(2).sum()
        loss = -_negentropy(Y).sum() + tv * _tv(Y.reshape(B, *image_shape)).sum() + decor
        loss.backward()
        opt.step()
    return M.detach()


def resolve_sign_scale(rows: torch.Tensor, g_weight: torch.Tensor, g_bias: torch.Tensor | None,
                       value_range: tuple[float, float] | None = (0.0, 1.0)) -> torch.Tensor:
    """Separated inputs with sign and scale fixed.

    With a bias gradient: x_k = (w_kᵀ ∂L/∂W) / (w_kᵀ ∂L/∂b), exact. Without: the sign that makes
    the source positively skewed (sparse bright strokes on a dark background; the CPA heuristic),
    then an affine map onto `value_range`.
    """
    sources = rows @ g_weight.double()
    if g_bias is not None:
        alpha = rows @ g_bias.double()
        ok = alpha.abs() > 1e-9 * alpha.abs().max().clamp_min(1e-300)
        out = sources.clone()
        out[ok] = sources[ok] / alpha[ok, None]
        if bool(ok.all()):
            return out
        sources = torch.where(ok[:, None], out, sources)
        fallback = ~ok
    else:
        fallback = torch.ones(len(sources), dtype=torch.bool)
    centred = sources - sources.mean(1, keepdim=True)
    skew = (centred ** 3).mean(1)
    flipped = torch.where((skew < 0)[:, None], -sources, sources)
    if value_range is not None:
        lo, hi = value_range
        mn, mx = flipped.min(1, keepdim=True).values, flipped.max(1, keepdim=True).values
        flipped = lo + (hi - lo) * (flipped - mn) / (mx - mn).clamp_min(1e-12)
    return torch.where(fallback[:, None], flipped, sources)
