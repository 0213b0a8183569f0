"""Lower bounds (any attack) and upper-bound scalings (tensor attack) for the two-layer model.

Observation model (Liu et al. §2 and App. D–E): O = D(G(S)) + ε, ε ~ N(0, σ_tot² I), where σ_tot² is the
server-side observation noise σ² plus the Gaussian noise the defense itself adds (noise, DP-SGD).
J := (∂O/∂S)ᵀ ∈ R^{Bd×P} (rows: input coordinates, columns: observed gradient coordinates).

    exact CRLB / van Trees     R² ≥ (σ_tot²/B) Tr((JJᵀ)⁻¹)               Eq. (27), when rank J = Bd
    Lemma D.2 relaxation       R² ≥ σ_tot² B d² / ||J||_F²               Eq. (28)

Closed forms (Table 1, constants dropped): lower σ_tot·c·√(d/m_eff), upper (K·B + σ_tot·c)·√(d/m_eff),
with c = max{1, ||G||/C} under clipping, m_eff = (1−p)m under dropout and (1−p̂)m under pruning.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from ..errors import GradleakError
from .defenses import DefendedGradient, TheoryDefense, defended_gradient, parse_defense
from .model import TwoLayerNet, gradient_at

# Above this many Jacobian entries only ||J||_F² is formed (chunked forward mode), not JJᵀ.
MAX_JACOBIAN_ENTRIES = 40_000_000


def jacobian(observe, x: torch.Tensor) -> torch.Tensor:
    """J (B·d, P) of the observation with respect to the data, via torch.func.

    Reverse mode (jacrev) costs one pass per observed coordinate, forward mode (jacfwd) one per
    input coordinate; pick the cheaper — the gradient has P = m(d+1) ≫ Bd coordinates here.
    """
    n_in = x.numel()
    n_out = observe(x).numel()
    if n_in * n_out > MAX_JACOBIAN_ENTRIES:
        raise GradleakError(f"Jacobian {n_in}×{n_out} too large to form; use frobenius_sq()")
    jac_fn = torch.func.jacrev if n_out <= n_in else torch.func.jacfwd
    J = jac_fn(observe)(x)  # (P, B, d)
    return J.reshape(n_out, n_in).T.contiguous()


def frobenius_sq(observe, x: torch.Tensor, chunk: int = 8) -> float:
    """||J||_F² by forward-mode JVPs over chunks of input directions (memory ∝ chunk·P)."""
    flat = x.reshape(-1)
    total = 0.0
    eye = torch.eye(flat.numel(), dtype=x.dtype)

    def jvp_dir(direction: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(observe, (x,), (direction.reshape(x.shape),))[1]

    for start in range(0, flat.numel(), chunk):
        cols = torch.func.vmap(jvp_dir)(eye[start:start + chunk])
        total += float(cols.pow(2).sum())
    return total


@dataclass
class BoundReport:
    defense: str
    d: int
    m: int
    batch_size: int
    activation: str
    noise: float  # server-side observation noise σ
    noise_total: float  # σ_tot including the defense's own noise
    frobenius_sq: float  # ||J||_F²
    lower_numeric: float  # Eq. (28) via Lemma D.2
    lower_crlb: float | None  # Eq. (27), exact trace form
    lower_closed_form: float  # σ_tot·c·√(d/m_eff), constant dropped
    upper_scaling: float | None  # (K·B + σ_tot·c)·√(d/m_eff); None where no upper bound is known (pruning)
    effective_width: float
    clip_factor: float
    pruned_fraction_hat: float | None  # p̂ = 1 − ||J_p||_F²/||J||_F² (pruning only)
    steps: int

    def as_dict(self) -> dict:
        return asdict(self)


def lower_bound(net: TwoLayerNet, x: torch.Tensor, y: torch.Tensor, noise: float,
                defense: TheoryDefense | str = "none", *, exact: bool = True,
                defended: DefendedGradient | None = None) -> BoundReport:
    """Numeric lower bound for the defended gradient of `net` at data (x, y), plus the Table 1 scalings."""
    if noise < 0:
        raise GradleakError(f"noise must be ≥ 0 (got {noise})")
    if isinstance(defense, str):
        defense = parse_defense(defense)
    dg = defended or defended_gradient(net, x, y, defense)
    B, d = x.shape
    m = net.width
    sigma_tot = math.sqrt(noise ** 2 + dg.defense_noise ** 2)
    P = dg.observe(x).numel()
    crlb = None
    if exact and P * B * d <= MAX_JACOBIAN_ENTRIES:
        J = jacobian(dg.observe, x)
        frob = float(J.pow(2).sum())
        if P >= B * d:
            eig = torch.linalg.eigvalsh(J @ J.T)
            if float(eig[0]) > 1e-10 * float(eig[-1]):
                crlb = math.sqrt(sigma_tot ** 2 / B * float((1.0 / eig).sum()))
    else:
        frob = frobenius_sq(dg.observe, x)
    if frob <= 0:
        raise GradleakError("the defended gradient does not depend on the data (||J||_F = 0): no finite bound")
    numeric = math.sqrt(sigma_tot ** 2 * B * d * d / frob)

    clip_factor = float(dg.extra.get("clip_factor", 1.0))
    p_hat = None
    width = dg.effective_width
    if defense.name == "prune":
        full = frobenius_sq(lambda x_: gradient_at(net.a, net.W, x_, y, net.activation), x)
        p_hat = max(0.0, 1.0 - frob / full)
        width = (1.0 - p_hat) * m
    closed = sigma_tot * clip_factor * math.sqrt(d / width)
    upper = None if defense.name == "prune" else (dg.steps * B + sigma_tot * clip_factor) * math.sqrt(d / width)
    return BoundReport(defense=str(defense), d=d, m=m, batch_size=B, activation=net.activation, noise=noise,
                       noise_total=sigma_tot, frobenius_sq=frob, lower_numeric=numeric, lower_crlb=crlb,
                       lower_closed_form=closed, upper_scaling=upper, effective_width=width,
                       clip_factor=clip_factor, pruned_fraction_hat=p_hat, steps=dg.steps)


@dataclass
class DPRequirement:
    epsilon: float
    delta: float
    sensitivity: float  # Δ = sup ||G(S) − G(S')||, estimated as 2·max per-sample gradient norm
    sensitivity_sq_over_m: float  # Δ²/m: stays O(1) as m grows (Prop. 2.1's Δ² = Õ(m))
    sigma_required: float  # Gaussian mechanism: σ = Δ √(2 ln(1.25/δ)) / ε
    exponent_note: str


def dp_noise_requirement(net: TwoLayerNet, epsilon: float, delta: float, *, label_bound: float = 1.0,
                         probes: int = 512, seed: int = 0) -> DPRequirement:
    """Prop. 2.1: noise an (ε, δ)-DP Gaussian mechanism needs on this network's gradient.

    We use σ² = 2 ln(1.25/δ) Δ²/ε² (the classical Gaussian mechanism, Dwork–Roth Thm A.1), i.e.
    σ² = Ω(m log(1/δ)/ε²) since Δ² = Θ(m) for a_j = 1/m, w_j ~ N(0, I) and unit-norm inputs.
    Δ is estimated from random unit inputs and labels ±label_bound, so it is a lower estimate of the sup.
    """
    if not (epsilon > 0 and 0 < delta < 1):
        raise GradleakError(f"need ε > 0 and 0 < δ < 1 (got ε={epsilon}, δ={delta})")
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(probes, net.dim, generator=gen, dtype=net.W.dtype)
    xs = xs / xs.norm(dim=1, keepdim=True)
    ys = label_bound * torch.where(torch.rand(probes, generator=gen) < 0.5, -1.0, 1.0).to(net.W.dtype)

    def per_sample(x1: torch.Tensor, y1: torch.Tensor) -> torch.Tensor:
        return gradient_at(net.a, net.W, x1[None], y1[None], net.activation).norm()

    norms = torch.func.vmap(per_sample)(xs, ys)
    sensitivity = 2.0 * float(norms.max())
    sigma = sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    note = ("σ² = 2 ln(1.25/δ)·Δ²/ε² with Δ² = Θ(m): exponent ε⁻² (Gaussian mechanism / moments accountant); "
            "the ε⁻¹ of the secondary summary is not what the Gaussian mechanism gives")
    return DPRequirement(epsilon, delta, sensitivity, sensitivity ** 2 / net.width, sigma, note)
