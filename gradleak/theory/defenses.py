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


# The two settings of the analysis that are not defenses of `gradleak.defenses`: no defense, and
# local training (the CLI's --local-steps/--lr). Every other name is a registered defense whose
# class gives its two-layer map (`Defense.two_layer`), under the same names, options and
# defaults (one vocabulary for attacks, utility and theory), plugins included.
THEORY_OWN: dict[str, type] = {"none": NoDefense, "local": LocalAggregation}


def covered_defenses() -> list[str]:
    """The names the two-layer analysis takes: `none`, `local` and every registered defense
    whose class gives its two-layer map, in the registry's order."""
    from ..defenses import DEFENSES

    covered = []
    for name in DEFENSES.names():
        try:
            cls = DEFENSES.get(name)
        except GradleakError:  # a plugin that does not load: `gradleak list defenses` says why
            continue
        if cls.in_two_layer_analysis():
            covered.append(name)
    return [*THEORY_OWN, *covered]


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
    if spec.name in THEORY_OWN:
        return TheoryDefense(spec.name, build_options(THEORY_OWN[spec.name], spec.options,
                                                      f"defense '{spec.name}'"))
    from ..defenses import DEFENSES, make_defense

    if spec.name not in DEFENSES or not DEFENSES.get(spec.name).in_two_layer_analysis():
        raise GradleakError(f"the two-layer analysis covers the defenses {', '.join(covered_defenses())}; "
                            f"got '{spec.name}'")
    defense = make_defense(spec)
    defense.check_two_layer()
    return TheoryDefense(spec.name, defense.options)


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


@dataclass
class TwoLayerView:
    """What a defense's two-layer map (`Defense.two_layer`) is built from: the network, the true
    batch (x, y), the gradient as a function of the data, and `result`, which wraps the map."""

    net: TwoLayerNet
    x: torch.Tensor
    y: torch.Tensor
    defense: TheoryDefense

    @property
    def width(self) -> int:
        return self.net.width

    @property
    def dim(self) -> int:
        return self.net.dim

    def plain(self, x_: torch.Tensor) -> torch.Tensor:
        """The undefended gradient [∇_a L, ∇_W L] at data x_ with the true labels."""
        return gradient_at(self.net.a, self.net.W, x_, self.y, self.net.activation)

    def gradient(self, x_: torch.Tensor, rows) -> torch.Tensor:
        """The undefended gradient of the examples `rows` (a slice or index tensor) of x_."""
        return gradient_at(self.net.a, self.net.W, x_[rows], self.y[rows], self.net.activation)

    def result(self, fn: Callable[[torch.Tensor], torch.Tensor], noise: float = 0.0,
               neurons: torch.Tensor | None = None, positions: torch.Tensor | None = None, steps: int = 1,
               width: float | None = None, **extra) -> DefendedGradient:
        """The defended gradient: `fn` maps the data to the observed vector, `noise` is the std the
        defense adds to every coordinate, `neurons`/`positions` the hidden units whose ∇_a
        coordinate is observed and where (all of them by default)."""
        everything = torch.arange(self.width)
        return DefendedGradient(fn, self.defense, noise, everything if neurons is None else neurons,
                                everything if positions is None else positions, steps,
                                float(self.width) if width is None else width, extra)


def defended_gradient(net: TwoLayerNet, x: torch.Tensor, y: torch.Tensor,
                      defense: TheoryDefense | str = "none") -> DefendedGradient:
    if isinstance(defense, str):
        defense = parse_defense(defense)
    view = TwoLayerView(net, x, y, defense)
    if defense.name == "none":
        return view.result(view.plain)
    if defense.name == "local":
        return _local(view, defense.options)
    from ..defenses import DEFENSES

    return DEFENSES.get(defense.name)(defense.options).two_layer(view)


def _local(view: TwoLayerView, opts: LocalAggregation) -> DefendedGradient:
    net, x, y, m, act = view.net, view.x, view.y, view.width, view.net.activation
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
    return view.result(accumulated, steps=K)
