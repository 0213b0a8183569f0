"""Wang–Lee–Lei (2023) tensor feature reconstruction for f(x) = Σ_j a_j σ(w_j·x), w_j ~ N(0, I_d).

With Zhong et al. (2017)'s tensor initialisation. By Stein's lemma, Hermite-weighted averages of
per-neuron gradients estimate moments of the batch:

    (1/m) Σ_j g_j H_p(w_j)          ≈ Σ_i r_i E[σ^(p)] x_i^{⊗p}      (g_j = ∂L/∂a_j,   "scalar" source)
    (1/m) Σ_j ĝ_j/a_j ⊗ H_{p-1}(w_j) ≈ Σ_i r_i E[σ^(p)] x_i^{⊗p}      (ĝ_j = ∂L/∂w_j,   "vector" source)

Pipeline: (1) span V of the x_i from the order-2 moment P̂ (eigh, top-B by |eigenvalue|) or, when
E σ'' = 0 (tanh/sigmoid), from the order-3 slice T̂(I,I,a); (2) reduce to B dims, u_j = Vᵀw_j (exact:
H_p(w)(V,…,V) = H_p(Vᵀw)); (3) decompose the reduced order-3 tensor, or for ReLU (E σ''' = 0) the
order-4 tensor contracted on two modes with a random symmetric matrix, by Jennrich's algorithm on
random slice pairs, keeping the pair whose eigenvectors jointly diagonalise all L slices best;
(4) lift x̂_i = V u_i / ||V u_i|| (unit-norm assumption); (5) signs from one odd- and one even-order
moment (Wang, Lee, Lei 2023, §5: fixing sign and scale): even orders give r_i, odd orders give s_i r_i.

Sign limitation: when σ is odd up to a constant (tanh, sigmoid) every moment with E σ^(p) ≠ 0 has
odd order, so (x_i, r_i) and (−x_i, −r_i) give the same gradient; the sign is then not identifiable
and `TensorResult.signs_resolved` is False (features are returned with an arbitrary sign).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import GradleakError

_SQRT_2PI = math.sqrt(2.0 * math.pi)
_ZERO = 1e-9


@dataclass(frozen=True)
class TensorResult:
    features: Tensor  # (B, d) unit-norm feature estimates
    residuals: Tensor  # (B,) estimated r_i (up to the unknown global scale of a); NaN where unidentifiable
    weights: Tensor  # (B,) decomposition weights (signed, of the tensor order used)
    signs_resolved: bool
    span: Tensor  # (d, B) orthonormal basis of the estimated span


def hermite_expectations(activation: str) -> tuple[float, float, float, float]:
    """E_{z~N(0,1)} σ^(p)(z) for p = 1..4 (distributional derivatives for the ReLU family)."""
    act = activation.lower()
    if act == "relu":
        return 0.5, 1 / _SQRT_2PI, 0.0, -1 / _SQRT_2PI
    if act.startswith("leaky_relu") or act == "leakyrelu":
        slope = float(act.split(":")[1]) if ":" in act else 0.01
        kink = 1.0 - slope  # σ = slope·z + (1 − slope)·relu(z)
        return slope + kink * 0.5, kink / _SQRT_2PI, 0.0, -kink / _SQRT_2PI
    smooth = {
        "tanh": np.tanh,
        "sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z)),
        "square_cube": lambda z: z ** 2 + z ** 3,  # the WLL synthetic experiment's σ(x) = x² + x³
        "softplus": lambda z: np.logaddexp(0.0, z),
    }
    if act not in smooth:
        raise GradleakError(f"tensor method: unknown activation {activation!r} "
                            f"(use relu, leaky_relu[:slope], {', '.join(smooth)})")
    # Stein: E σ^(p)(z) = E σ(z) He_p(z); Gauss–HermiteE quadrature is exact up to smoothness.
    nodes, wts = np.polynomial.hermite_e.hermegauss(120)
    wts = wts / wts.sum()
    vals = smooth[act](nodes)
    out = []
    for p in range(1, 5):
        coef = np.zeros(p + 1)
        coef[p] = 1.0
        out.append(float(np.sum(wts * vals * np.polynomial.hermite_e.hermeval(nodes, coef))))
    return tuple(0.0 if abs(v) < 1e-7 else v for v in out)  # type: ignore[return-value]


# ----------------------------------------------------------------------------- moment estimators
# A "source" is (coef, U): coef (m,) for the scalar source or (m, k) for the vector source, U (m, k)
# the (possibly span-reduced) first-layer rows. Each estimator returns Σ_i r_i E σ^(p) x_i^{⊗p} (sliced).

def _order1(coef: Tensor, U: Tensor) -> Tensor:
    return U.T @ coef / U.shape[0] if coef.dim() == 1 else coef.mean(0)


def _order2(coef: Tensor, U: Tensor) -> Tensor:
    m, k = U.shape
    if coef.dim() == 1:
        return (U.T @ (coef[:, None] * U) - coef.sum() * torch.eye(k, dtype=U.dtype)) / m
    M = coef.T @ U / m
    return (M + M.T) / 2


def _order3_slice(coef: Tensor, U: Tensor, a: Tensor) -> Tensor:
    """T̂(I, I, a) for a vector a (k,)."""
    m, k = U.shape
    t = U @ a  # (m,)
    eye = torch.eye(k, dtype=U.dtype)
    if coef.dim() == 1:
        ua = U.T @ coef  # Σ g_j u_j
        return (U.T @ ((coef * t)[:, None] * U) - torch.outer(ua, a) - torch.outer(a, ua)
                - (coef @ t) * eye) / m
    # T1_{pqr} = h_p (u_q u_r − δ_qr), symmetrised over the three cyclic placements of h.
    S1 = coef.T @ (t[:, None] * U) - torch.outer(coef.sum(0), a)  # T1(I, I, a)
    ha = coef @ a  # (m,)
    S2 = U.T @ (ha[:, None] * U) - ha.sum() * eye  # T1(a, I, I)
    return (S1 + S1.T + S2) / (3 * m)


def _order4_slice(coef: Tensor, U: Tensor, A: Tensor) -> Tensor:
    """T̂(I, I, A) for a symmetric matrix A (k, k) contracted on the last two modes."""
    m, k = U.shape
    AU = U @ A  # rows (A u_j)ᵀ
    q = (AU * U).sum(1)  # u_jᵀ A u_j
    tr = torch.trace(A)
    eye = torch.eye(k, dtype=U.dtype)
    if coef.dim() == 1:
        cross = U.T @ (coef[:, None] * AU)
        return (U.T @ ((coef * (q - tr))[:, None] * U) - 2 * (cross + cross.T)
                + (coef @ (tr - q)) * eye + 2 * coef.sum() * A) / m
    # h ⊗ H_3(u) contracted on the last two modes with A; symmetrised over the first two.
    S = coef.T @ ((q - tr)[:, None] * U - 2 * AU) / m
    return (S + S.T) / 2


def _polynomial_features(U: Tensor, degree: int) -> Tensor:
    """Monomials of the rows of U up to `degree` (including the constant)."""
    m, k = U.shape
    cols = [torch.ones(m, 1, dtype=U.dtype)]
    prev = [((), torch.ones(m, dtype=U.dtype))]
    for _ in range(degree):
        nxt = []
        for idx, val in prev:
            for j in range(idx[-1] if idx else 0, k):
                nxt.append((idx + (j,), val * U[:, j]))
        cols.append(torch.stack([v for _, v in nxt], 1))
        prev = nxt
    return torch.cat(cols, 1)


def _control_variates(coef: Tensor, U: Tensor, degree: int) -> Tensor:
    """coef minus its least-squares fit on polynomials of U of degree ≤ `degree`.

    Hermite polynomials of different degree are orthogonal under N(0, I), so removing the
    low-degree part leaves E[coef·H_p] unchanged for p > degree but removes most of its variance
    (the constant and linear parts of σ dominate g_j).
    """
    if coef.dim() == 2:  # the vector source pairs ĝ with H_{p-1}: one degree less to remove
        degree -= 1
    if degree < 0:
        return coef
    feats = _polynomial_features(U, degree)
    if feats.shape[1] * 4 > U.shape[0]:  # too few neurons to fit them reliably
        return coef
    target = coef if coef.dim() == 2 else coef[:, None]
    fitted = feats @ torch.linalg.lstsq(feats, target).solution
    out = target - fitted
    return out if coef.dim() == 2 else out[:, 0]


# ----------------------------------------------------------------------------- decomposition
def _jennrich(slices: Tensor, rank: int, generator: torch.Generator | None) -> Tensor:
    """Components (k, rank) of slices S_l ≈ U diag(d_l) Uᵀ: Jennrich on random slice-combination
    pairs, keeping the candidate that diagonalises all slices best (robust to one bad pencil)."""
    L, k, _ = slices.shape
    s64 = slices.double()
    best, best_score = None, math.inf
    trials = max(4, min(L, 40))
    for _ in range(trials):
        alpha = torch.randn(L, generator=generator, dtype=torch.float64)
        beta = torch.randn(L, generator=generator, dtype=torch.float64)
        Ma = torch.einsum("l,lij->ij", alpha, s64)
        Mb = torch.einsum("l,lij->ij", beta, s64)
        try:
            evals, evecs = np.linalg.eig((Ma @ torch.linalg.pinv(Mb)).numpy())
        except np.linalg.LinAlgError:
            continue
        order = np.argsort(-np.abs(evals))[:rank]
        U = torch.from_numpy(np.real(evecs[:, order])).double()
        U = U / U.norm(dim=0, keepdim=True).clamp_min(1e-12)
        try:
            Z = torch.linalg.pinv(U)  # Z S_l Zᵀ should be diagonal
        except RuntimeError:
            continue
        D = Z @ s64 @ Z.T
        off = (D - torch.diag_embed(torch.diagonal(D, dim1=1, dim2=2))).pow(2).sum()
        score = float(off / D.pow(2).sum().clamp_min(1e-300))
        if score < best_score:
            best, best_score = U, score
    if best is None:
        raise GradleakError("tensor method: decomposition failed (degenerate moment tensor)")
    return best


def _lstsq_weights(target: Tensor, basis: list[Tensor]) -> Tensor:
    A = torch.stack([b.reshape(-1) for b in basis], 1)
    return torch.linalg.lstsq(A, target.reshape(-1, 1)).solution[:, 0]


def tensor_decompose(coef: Tensor, W: Tensor, batch_size: int, activation: str = "relu", *,
                     projections: int = 100, generator: torch.Generator | None = None) -> TensorResult:
    """Shared pipeline for both gradient sources (see module docstring)."""
    if W.dim() != 2:
        raise GradleakError(f"tensor method: W must be (m, d), got shape {tuple(W.shape)}")
    m, d = W.shape
    if coef.shape[0] != m:
        raise GradleakError(f"tensor method: gradient has {coef.shape[0]} rows but W has {m}")
    if not 1 <= batch_size <= d:
        raise GradleakError(f"tensor method: batch_size must be in [1, d={d}], got {batch_size}")
    if projections < 2:
        raise GradleakError("tensor method: projections must be at least 2")
    e1, e2, e3, e4 = hermite_expectations(activation)
    B = batch_size
    W = W.double()
    coef = coef.double()

    # (1) span
    span_coef = _control_variates(coef, W, 1)
    if abs(e2) > _ZERO:
        P = _order2(span_coef, W)
    elif abs(e3) > _ZERO:
        # Σ_l T̂(I,I,a_l)² has range span{x_i} whatever the signs of ⟨a_l, x_i⟩; several random
        # directions avoid losing a sample with ⟨a, x_i⟩ ≈ 0.
        probes = torch.randn(8, d, generator=generator, dtype=torch.float64)
        P = sum(S @ S for S in (_order3_slice(span_coef, W, a / a.norm()) for a in probes))
    else:
        raise GradleakError(f"tensor method: activation {activation!r} has E σ'' = E σ''' = 0")
    evals, evecs = torch.linalg.eigh(P)
    V = evecs[:, torch.argsort(evals.abs(), descending=True)[:B]]

    # (2) reduce, (3) decompose
    U = W @ V
    c = coef @ V if coef.dim() == 2 else coef
    if abs(e3) > _ZERO:
        order = 3
        c_cv = _control_variates(c, U, 2)
        probes = torch.randn(projections, B, generator=generator, dtype=torch.float64)
        slices = torch.stack([_order3_slice(c_cv, U, p) for p in probes])
    elif abs(e4) > _ZERO:
        order = 4
        c_cv = _control_variates(c, U, 3 if B <= 12 else 2)
        G = torch.randn(projections, B, B, generator=generator, dtype=torch.float64)
        probes = (G + G.transpose(1, 2)) / 2
        slices = torch.stack([_order4_slice(c_cv, U, p) for p in probes])
    else:
        raise GradleakError(f"tensor method: activation {activation!r} has E σ''' = E σ'''' = 0")
    comps = _jennrich(slices, B, generator)  # (B, B), unit columns

    # per-component slice weight: slice_l ≈ Σ_i λ_i ⟨probe_l, ·⟩ u_i u_iᵀ
    outer = [torch.outer(comps[:, i], comps[:, i]) for i in range(B)]
    if order == 3:
        scale = probes @ comps  # (L, B): ⟨a_l, u_i⟩
    else:
        scale = torch.einsum("ai,lab,bi->li", comps, probes, comps)  # u_iᵀ A_l u_i
    design = torch.stack([(scale[:, i, None, None] * outer[i]).reshape(-1) for i in range(B)], 1)
    lam = torch.linalg.lstsq(design, slices.reshape(-1, 1)).solution[:, 0]  # r_i E σ^(order) s_i^order

    # (5) signs: need one even-order and one odd-order coefficient
    coeffs: dict[int, tuple[Tensor, float]] = {order: (lam, (e3, e4)[order - 3])}
    if abs(e1) > _ZERO:
        coeffs[1] = (_lstsq_weights(_order1(c, U), [comps[:, i] for i in range(B)]), e1)
    if abs(e2) > _ZERO:
        coeffs[2] = (_lstsq_weights(_order2(_control_variates(c, U, 1), U), outer), e2)
    even = [k for k in coeffs if k % 2 == 0]
    odd = [k for k in coeffs if k % 2 == 1]
    signs = torch.ones(B, dtype=torch.float64)
    residuals = torch.full((B,), float("nan"), dtype=torch.float64)
    resolved = bool(even and odd)
    if even:
        k = 2 if 2 in even else even[0]  # order 2 is the least noisy even estimate
        residuals = coeffs[k][0] / coeffs[k][1]
    if resolved:
        k = 1 if 1 in odd else 3
        signed = coeffs[k][0] / coeffs[k][1]  # s_i r_i
        signs = torch.sign(signed * residuals)
        signs[signs == 0] = 1.0

    X = (V @ comps * signs).T
    X = X / X.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return TensorResult(features=X.float(), residuals=residuals.float(), weights=lam.float(),
                        signs_resolved=resolved, span=V.float())


def tensor_features(g: Tensor, W: Tensor, batch_size: int, activation: str = "relu", *,
                    projections: int = 100, generator: torch.Generator | None = None) -> Tensor:
    """Unit-norm features (B, d) from output-weight gradients g_j = ∂L/∂a_j of Σ_j a_j σ(w_j·x).

    Signs are resolved when σ has both an odd and an even non-vanishing Hermite moment (ReLU,
    leaky ReLU, softplus, x²+x³); for tanh/sigmoid they are arbitrary (see module docstring).
    The overall scale of a and of g is irrelevant.
    """
    if g.dim() != 1:
        raise GradleakError(f"tensor_features: g must be a vector (m,), got shape {tuple(g.shape)}")
    return tensor_decompose(g.detach(), W.detach(), batch_size, activation,
                            projections=projections, generator=generator).features


def tensor_features_from_first_layer(G_W: Tensor, W: Tensor, batch_size: int, activation: str = "relu",
                                     *, a: Tensor | None = None, projections: int = 100,
                                     generator: torch.Generator | None = None) -> Tensor:
    """Unit-norm features (B, d) from the first-layer gradient rows ĝ_j = ∂L/∂w_j (WLL App. B).

    `a` (m,) are the output weights; rows are divided by a_j (default: all equal, which only
    changes the irrelevant global scale).
    """
    if G_W.shape != W.shape:
        raise GradleakError(f"tensor_features_from_first_layer: G_W {tuple(G_W.shape)} and W "
                            f"{tuple(W.shape)} must have the same shape")
    H = G_W.detach().double()
    if a is not None:
        a = a.detach().double().reshape(-1)
        if a.shape[0] != W.shape[0] or bool((a == 0).any()):
            raise GradleakError("tensor_features_from_first_layer: a must be (m,) with no zeros")
        H = H / a[:, None]
    return tensor_decompose(H, W.detach(), batch_size, activation,
                            projections=projections, generator=generator).features
