"""CPL, the client-privacy-leakage attack of Wei et al. (ESORICS 2020, Algorithm 1).

Labels come from the update (iDLG for a batch of 1, label counts otherwise);
the data start from a configurable seed (random, patterned, dark, light, r, g,
b, or optimal = a same-class held-out example) and are optimised with L-BFGS,
Adam or SGD to minimise

    D = dist(∇w_att, ∇w_k) + α ‖softmax(f(x)) − onehot(y)‖²

with dist = L2 (Σ‖a−b‖²) or cosine. FedAvg deltas are matched by replaying the
τ local steps (`UpdateSimulator`) and, as in Algorithm 1, compared in gradient
units (Δw / η per step) so the termination threshold means the same. The attack
stops at `iterations` or once the gradient distance is ≤ `threshold` (1e-4 in
the paper); `Reconstruction.iterations` is the number of iterations it took,
`converged` whether the threshold was reached (the paper's attack success).

Near the solution D ≈ ‖J(x − x*)‖² with J = ∂∇w/∂x, and J scales with the
back-propagated error, as does ‖∇w‖: an example the model already classifies
confidently has a ‖∇w‖² tens of times smaller than the others and reaches 1e-4
while still far from the image. So the stop level is min(threshold, relative × ‖∇w‖²), both known to
the server. `normalise=true` divides the objective by that level so that
L-BFGS's absolute tolerances do not stall it at D ≈ 3e-6; it is off by default
because when the level is never reached (noisy updates) the scaled L-BFGS
without line search diverges.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ...options import check
from ...threat import Observation
from ..base import AttackContext, Reconstruction, ResumableAttack
from ..engine.candidates import FixedLabels, Pixels
from ..engine.engine import Engine, Optimizer, plain_forward
from ..engine.initialization import InitKind, observed_start
from ..engine.objectives import LabelConfidence, Matching
from ..learned.learned import learned_start
from ..replay.labels import recover_labels
from ..replay.matching import SecondOrder, UpdateSimulator, gradient_scale

DEFAULT_LR = {"lbfgs": 1.0, "adam": 0.1, "sgd": 0.1}
OptimizerKind = Literal["lbfgs", "adam", "sgd"]


@dataclass
class CPLOptions:
    init: InitKind = "patterned"
    tile: int = 2  # patterned: the random patch is repeated tile×tile times
    optimizer: OptimizerKind = "lbfgs"
    lr: float | None = None  # None: 1.0 for L-BFGS (Wei et al.), 0.1 for Adam/SGD
    distance: Literal["l2", "cosine"] = "l2"
    alpha: float = 0.0  # label regulariser weight
    iterations: int = 300  # maximum attack iterations (Wei et al. default)
    threshold: float = 1e-4  # stop when the gradient distance is <= this (0: never)
    relative: float = 1e-7  # ... and <= relative × ‖∇w‖² of the observed update (0: off)
    normalise: bool = False  # True: divide the objective by the stop level (L-BFGS tolerances are absolute)
    inner: int = 20  # L-BFGS function evaluations per iteration (torch default, as in the reference code)
    history_size: int = 100
    line_search: bool = False
    label_method: Literal["auto", "bias", "weight"] = "auto"
    # auto: the frozen-kink finite difference on convolutional models' FedSGD gradients
    # (attacks.replay.finite_difference; cheaper per iteration, same L-BFGS result), else exact
    second_order: SecondOrder = "auto"

    def __post_init__(self):
        check(self.tile in (2, 4), "attack 'cpl': tile must be 2 or 4")
        check(self.lr is None or self.lr > 0, "attack 'cpl': lr must be > 0")
        check(self.alpha >= 0, "attack 'cpl': alpha must be >= 0")
        check(self.iterations >= 1, "attack 'cpl': iterations must be >= 1")
        check(self.threshold >= 0, "attack 'cpl': threshold must be >= 0")
        check(self.relative >= 0, "attack 'cpl': relative must be >= 0")
        check(self.inner >= 1, "attack 'cpl': inner must be >= 1")
        check(self.history_size >= 1, "attack 'cpl': history_size must be >= 1")


class CPL(ResumableAttack):
    """Client privacy leakage (Wei et al.): configurable init, optimizer, distance, termination."""

    name = "cpl"
    budgets = {"quick": {"iterations": 150}, "thorough": {"iterations": 600}}
    Options = CPLOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels", "local_training", "prior_data"})
    modalities = ("image", "tabular")

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        opt = self.options
        sim = UpdateSimulator(obs, ctx.device, second_order=opt.second_order)
        labels = recover_labels(obs, opt.label_method, ctx.generator(17)).to(ctx.device)
        shape = (obs.batch_size, *obs.input_shape)
        scale = gradient_scale(obs.update)
        stop = opt.threshold  # termination level on the gradient distance (module docstring)
        if opt.relative and opt.threshold:
            stop = min(stop, opt.relative * sum(float((t * scale).pow(2).sum()) for t in sim.target.values()))
        engine = Engine(
            matching=Matching(sim, sim.target, opt.distance, scale=scale), labels=FixedLabels(labels),
            candidates=lambda r: Pixels(observed_start(opt.init, shape, ctx.generator(0), obs, labels, ctx,
                                                       tile=opt.tile, learned=learned_start).to(ctx.device)),
            optimizer=Optimizer(opt.optimizer, opt.lr or DEFAULT_LR[opt.optimizer], inner=opt.inner,
                                history=opt.history_size, line_search=opt.line_search),
            priors=[LabelConfidence(opt.alpha, obs.num_classes)], iterations=opt.iterations, threshold=stop,
            loss_scale=1.0 / stop if opt.normalise and stop > 0 else 1.0, model=sim.model,
            forward=plain_forward(sim.model, sim.params, sim.buffers), trace_every=1, progress=ctx.progress,
            deadline=ctx.deadline)
        for out in engine.start().doublings(opt.iterations):
            yield Reconstruction(inputs=out.inputs.cpu(), labels=labels.cpu(), iterations=out.iterations,
                                 converged=out.converged, final_distance=out.distance, **out.trace_fields(),
                                 extras={"converged": out.converged})
