"""Each defense of Liu et al. Table 1 as a differentiable map S ↦ D(G(S)) on the two-layer model.

`defended_gradient(net, x, y, spec)` returns a `DefendedGradient`: the observation function of the
data (so that torch.func can take its Jacobian), the defense's own Gaussian noise, and the bookkeeping
the bounds and the tensor attack need (which coordinates survive, effective width, step count).
Data-dependent selections (pruning masks) are fixed at the true data: they are piecewise constant,
so their derivative is zero almost everywhere (Liu et al., Thm 3.1/3.2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from ..errors import GradleakError
from ..options import build_options, check, parse_spec
from .model import TwoLayerNet, gradient_at


@dataclass
class NoDefense:
    pass


@dataclass
class LocalAggregation:
    """K local SGD steps; the server divides the parameter delta by the (known) learning rates.

    Separate rates for a and W (Prop. C.1): η_a = lr/m keeps a_j = 1/m nearly fixed, η_W = lr·m
    moves w_j by O(lr) since ∇_{w_j}L = O(1/m).
    """

    steps: int = 2
    lr: float = 0.01
    batches: Literal["same", "split"] = "same"

    def __post_init__(self):
        check(self.steps >= 1, f"local: steps must be ≥ 1 (got {self.steps})")
        check(self.lr > 0, f"local: lr must be > 0 (got {self.lr})")


# The defenses of `gradleak.defenses` that the two-layer analysis covers, under the same
# names, options and defaults (one vocabulary for attacks, utility and theory), plus `local`,
# which is local training (the CLI's --local-steps/--lr), not a defense of the update.
COVERED = ("noise", "clip", "dpsgd", "dropout", "prune", "secagg")
DEFENSE_OPTIONS: dict[str, type | None] = {"none": NoDefense, "local": LocalAggregation,
                                           **{name: None for name in COVERED}}


@dataclass(frozen=True)
class TheoryDefense:
    name: str
    options: object

    def __str__(self) -> str:
        fields = getattr(self.options, "__dataclass_fields__", {})
        items = ",".join(f"{k}={getattr(self.options, k)}" for k in fields if k != "seed")
        return self.name + (":" + items if items else "")


def parse_defense(text: str) -> TheoryDefense:
    """`name:k=v` with the options of the same defense in `gradleak.defenses`."""
    spec = parse_spec(text, "defense")
    if spec.name not in DEFENSE_OPTIONS:
        raise GradleakError(f"the two-layer analysis covers the defenses {', '.join(DEFENSE_OPTIONS)}; "
                            f"got '{spec.name}'")
    if spec.name in ("none", "local"):
        return TheoryDefense(spec.name, build_options(DEFENSE_OPTIONS[spec.name], spec.options,
                                                      f"defense '{spec.name}'"))
    from ..defenses import make_defense

    options = make_defense(spec).options
    if spec.name == "noise" and options.snr_db is not None:
        raise GradleakError("defense 'noise': the two-layer analysis takes an absolute sigma, not snr_db")
    if spec.name == "dropout" and options.place != "model":
        raise GradleakError("defense 'dropout': the two-layer analysis drops hidden units, i.e. "
                            "dropout:place=model (place=update drops single update entries)")
    return TheoryDefense(spec.name, options)


@dataclass
class DefendedGradient:
    observe: Callable[[torch.Tensor], torch.Tensor]  # x (B, d) → observed vector, before any noise
    defense: TheoryDefense
    defense_noise: float  # std of the Gaussian noise the defense itself adds to every observed coordinate
    neurons: torch.Tensor  # hidden units whose ∇_a coordinate is observed (attack input)
    a_positions: torch.Tensor  # where those coordinates sit in the observed vector
    steps: int = 1  # K of local aggregation (upper bound grows ∝ K)
    effective_width: float = 0.0  # (1−p)m for dropout, m otherwise
    extra: dict = field(default_factory=dict)


def defended_gradient(net: TwoLayerNet, x: torch.Tensor, y: torch.Tensor,
                      defense: TheoryDefense | str = "none") -> DefendedGradient:
    if isinstance(defense, str):
        defense = parse_defense(defense)
    m, act = net.width, net.activation
    opts = defense.options
    everything = torch.arange(m)

    def plain(x_: torch.Tensor) -> torch.Tensor:
        return gradient_at(net.a, net.W, x_, y, act)

    def result(fn, noise=0.0, neurons=everything, positions=everything, steps=1, width=float(m), **extra):
        return DefendedGradient(fn, defense, noise, neurons, positions, steps, width, extra)

    if defense.name == "none":
        return result(plain)
    if defense.name == "noise":
        return result(plain, noise=opts.sigma)
    if defense.name == "secagg":
        parts = torch.arange(x.shape[0]).tensor_split(opts.clients)

        def aggregated(x_: torch.Tensor) -> torch.Tensor:
            # With the summed loss Σ_k (B_k/B)·(B/B_k)·G_k = Σ_k G_k: one batch of size B.
            return sum(gradient_at(net.a, net.W, x_[idx], y[idx], act) for idx in parts if len(idx))
        return result(aggregated)
    if defense.name == "clip":
        norm = float(plain(x).norm())

        def clipped(x_: torch.Tensor) -> torch.Tensor:
            g = plain(x_)
            return g * torch.clamp(opts.bound / g.norm(), max=1.0)
        return result(clipped, grad_norm=norm, clip_factor=max(1.0, norm / opts.bound))
    if defense.name == "dpsgd":
        # As gradleak.defenses.dpsgd and Opacus: every example's gradient clipped to `clip`,
        # averaged, plus N(0, (sigma·clip/B)²) on every coordinate of the average.
        batch = x.shape[0]

        def per_example_clipped(x_: torch.Tensor) -> torch.Tensor:
            grads = [gradient_at(net.a, net.W, x_[i:i + 1], y[i:i + 1], act) for i in range(batch)]
            return sum(g * torch.clamp(opts.clip / g.norm(), max=1.0) for g in grads) / batch
        norms = [float(gradient_at(net.a, net.W, x[i:i + 1], y[i:i + 1], act).norm()) for i in range(batch)]
        # Every example is scaled by its own factor; the least-clipped one bounds the error
        # from below, so the closed form uses the smallest factor.
        return result(per_example_clipped, noise=opts.sigma * opts.clip / batch, grad_norm=max(norms),
                      clip_factor=max(1.0, min(norms) / opts.clip))
    if defense.name == "local":
        eta_a, eta_W = opts.lr / m, opts.lr * m
        K = opts.steps
        chunks = (torch.arange(x.shape[0]).tensor_split(K) if opts.batches == "split"
                  else [torch.arange(x.shape[0])] * K)
        if any(len(c) == 0 for c in chunks):
            raise GradleakError(f"local: batches=split needs batch size ≥ steps={K}")

        def accumulated(x_: torch.Tensor) -> torch.Tensor:
            a, W = net.a, net.W
            total = torch.zeros(net.num_params, dtype=W.dtype)
            for idx in chunks:
                g = gradient_at(a, W, x_[idx], y[idx], act)
                total = total + g
                a = a - eta_a * g[:m]
                W = W - eta_W * g[m:].reshape(W.shape)
            return total  # (Θ⁰ − Θᴷ)/η, block by block
        return result(accumulated, steps=K)
    if defense.name == "dropout":  # place=model: hidden units dropped, effective width (1 − p)m
        gen = torch.Generator().manual_seed(opts.seed)
        kept = (torch.rand(m, generator=gen) >= opts.p).nonzero().flatten()
        if len(kept) == 0:
            raise GradleakError("dropout: every hidden unit was dropped")
        coords = torch.cat([kept, m + (kept[:, None] * net.dim + torch.arange(net.dim)).flatten()])
        return result(lambda x_: plain(x_)[coords], neurons=kept, positions=torch.arange(len(kept)),
                      width=float(len(kept)), coordinates=coords)
    if defense.name == "prune":
        g = plain(x).detach()
        # scope=layer prunes the a- and W-blocks separately, scope=global the whole vector
        blocks = [(0, m), (m, g.numel())] if opts.scope == "layer" else [(0, g.numel())]
        kept = []
        for lo, hi in blocks:
            keep = (hi - lo) - int(round(opts.ratio * (hi - lo)))
            kept.append(lo + torch.topk(g[lo:hi].abs(), max(keep, 1)).indices)
        coords = torch.sort(torch.cat(kept)).values
        a_mask = coords < m
        return result(lambda x_: plain(x_)[coords], neurons=coords[a_mask],
                      positions=a_mask.nonzero().flatten(), coordinates=coords,
                      a_share_kept=float(a_mask.sum()) / m)
    raise GradleakError(f"theory defense '{defense.name}' is not implemented")  # unreachable: parse checks
