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

    `nonnegative` (inputs known to be ≥ 0 with many zeros: MNIST-like images, ReLU features) adds
    a sparse non-negative component search seeded by the ICA solution (`_nonnegative_vertices`):
    every such input is a vertex of the cone {w : wᵀZ ≥ 0} with far more zeros than a generic
    vertex; LPs plus reweighted ℓ1 find those vertices, up to len(ICA)·2 + `starts`·B starts.
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


def _nonnegative_vertices(Z: torch.Tensor, init: torch.Tensor, starts: int, seed: int,
                          reweight_steps: int = 3, reweight_eps: float = 3e-2) -> torch.Tensor:
    """B rows w whose signals wᵀZ are the sparsest non-negative signals in the span of Z.

    Every input that is ≥ 0 with enough zeros of its own is an extreme ray of the cone
    {s = Zᵀw ≥ 0}; a generic vertex of that cone has only B − 1 zeros (besides the coordinates
    every input leaves at zero), an input has its whole zero set. So: reach a vertex by the LP
    min 1ᵀs s.t. s ≥ 0, ⟨w, u⟩ = 1; push it to a sparser one by reweighted ℓ1 (weights
    1/(s + ε·max s), `reweight_steps` LPs; Candès–Wakin–Boyd); call a vertex with ≥ 2(B − 1)
    zeros of its own an input and normalise later LPs on the coordinates no input found so far
    explains (found inputs have ⟨w, u⟩ = 0 there, so the LP cannot return them again). The ICA
    directions (both signs) seed the search; it stops after max(B, 16) random starts in a row
    found no new input, or after `starts`·B of them. Returns the B distinct vertices with the
    most zeros (ICA rows fill up if fewer were found). Exact zeros are needed: on noisy
    gradients (DP noise, quantisation) the search finds nothing and the ICA rows are returned.
    """
    Zn = Z.numpy()
    B = Zn.shape[0]
    col = np.linalg.norm(Zn, axis=0)
    Za = Zn[:, col > 1e-6 * col.max()]  # coordinates no input uses carry no information
    d = Za.shape[1]
    rng = np.random.default_rng(seed)

    def vertex(weights: np.ndarray, u: np.ndarray) -> np.ndarray | None:
        # unit u and weights keep the solution O(1), so HiGHS's absolute tolerances stay small
        u = u / max(np.linalg.norm(u), 1e-300)
        res = linprog(Za @ (weights / weights.max()), A_ub=-Za.T, b_ub=np.zeros(d), A_eq=u[None],
                      b_eq=[1.0], bounds=[(None, None)] * B, method="highs")
        if res.status != 0:
            return None
        s = res.x @ Za
        return res.x if s.min() >= -1e-6 * s.max() else None

    seeds = list(init.numpy()) + list(-init.numpy())
    found: list[tuple[int, np.ndarray, np.ndarray]] = []  # (own zeros, w, unit signal)
    inputs: list[np.ndarray] = []
    stale = 0
    for k in range(len(seeds) + starts * B):
        if k < len(seeds):
            u = seeds[k]
        else:
            # normalise on the coordinates no input found so far explains: the LP's ratio
            # 1ᵀs / rᵀs then favours the sources still missing
            free = np.ones(d, dtype=bool)
            for w_in in inputs:
                s_in = w_in @ Za
                free &= np.abs(s_in) <= 1e-5 * s_in.max()
            idx = np.flatnonzero(free) if free.any() else np.arange(d)
            r = np.zeros(d)
            r[idx] = rng.exponential(size=len(idx)) ** 4
            u = Za @ r
        if inputs:
            Q, _ = np.linalg.qr(np.array(inputs).T)
            u = u - Q @ (Q.T @ u)
        w = vertex(np.ones(d), u)
        for _ in range(reweight_steps if w is not None else 0):
            s = w @ Za
            better = vertex(1.0 / (np.maximum(s, 0) + reweight_eps * s.max()), w)
            if better is None:
                break
            w = better
        stale += 1
        if w is not None:
            s = w @ Za
            zeros = int((np.abs(s) <= 1e-5 * s.max()).sum())  # float32 gradients: noise ~1e-7
            unit = s / max(np.linalg.norm(s), 1e-300)
            if all(unit @ f[2] < 0.999 for f in found):
                found.append((zeros, w, unit))
                if zeros >= 2 * (B - 1):
                    inputs.append(w)
                    stale = 0
        if k >= len(seeds) and stale >= max(B, 16):
            break
    found.sort(key=lambda f: -f[0])
    chosen = [f[1] for f in found[:B]]
    if len(chosen) < B:  # fewer distinct vertices than inputs: fill with ICA directions
        chosen += list(init.numpy()[: B - len(chosen)])
    return torch.from_numpy(np.array(chosen))


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
