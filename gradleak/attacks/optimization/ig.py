"""Inverting Gradients (Geiping et al., NeurIPS 2020).

Cosine distance between the simulated and the observed update plus a total-
variation prior, optimised with Adam on the sign of the gradient, learning rate
decayed ×0.1 at 3/8, 5/8, 7/8 of the run, pixels kept in [0, 1]; several
restarts, keeping the one whose update matches best (`final=best`, the paper's
rule) or the registered mean of those that match almost as well (`final=mean`,
final distance ≤ `mean_within` × the best): pixels the update barely constrains
— borders, rows a floor-mode pool drops — end where each restart's random start
left them, and averaging restarts cancels part of that noise, while a restart
stuck far from the best would only blur it (docs/optimization-attacks.md).
Works on FedSGD gradients and on FedAvg deltas (the τ local steps are unrolled,
see `UpdateSimulator`).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from ...options import check
from ...threat import Observation
from ..base import AttackContext, Reconstruction, ResumableAttack
from ..engine.candidates import FixedLabels, Pixels
from ..engine.engine import Engine, Optimizer, ScheduleKind
from ..engine.initialization import InitKind, observed_start
from ..engine.objectives import GradientRegularisation, Matching, TotalVariation
from ..learned.learned import learned_start
from ..replay.labels import recover_labels
from ..replay.matching import SecondOrder, UpdateSimulator


@dataclass
class IGOptions:
    # Signed Adam with a light TV prior; steps and TV chosen on MNIST/LeNet batch 1
    # (`python -m benchmarks optim` prints the quality per budget).
    iterations: int = 2500
    lr: float = 0.1
    tv: float = 1e-6
    restarts: int = 1
    final: Literal["best", "mean"] = "best"
    mean_within: float = 2.0
    # successive halving of the restarts, optimised together: after each of these fractions
    # of the run only the better-matching half goes on (e.g. restarts=8,halving=0.25;0.5)
    halving: tuple[float, ...] = field(default=(), metadata={"range": (0, 1)})
    distance: Literal["cosine", "l2", "l1"] = "cosine"
    init: InitKind = "randn"
    signed: bool = True
    schedule: ScheduleKind = "step"  # step: ×0.1 at 3/8, 5/8, 7/8 (Geiping et al.); cosine: to lr/10
    label_method: Literal["auto", "bias", "weight"] = "auto"
    # auto: the frozen-kink finite difference on convolutional models' FedSGD gradients
    # (attacks.replay.finite_difference; 1.3–1.9× faster per iteration, same PSNR), else exact
    second_order: SecondOrder = "auto"

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'ig': iterations must be >= 1")
        check(self.lr > 0, "attack 'ig': lr must be > 0")
        check(self.tv >= 0, "attack 'ig': tv must be >= 0")
        check(self.restarts >= 1, "attack 'ig': restarts must be >= 1")
        check(self.mean_within >= 1, "attack 'ig': mean_within must be >= 1")


class InvertingGradients(ResumableAttack):
    """Inverting Gradients: cosine matching + TV, signed Adam, restarts."""

    name = "ig"
    budgets = {"quick": {"iterations": 1000}, "thorough": {"iterations": 2500, "restarts": 4, "final": "mean"}}
    # measured on imagenet-samples at 32 px and reported on cifar10 samples (docs/optimization-attacks.md)
    presets = {"fast": {"iterations": 450, "restarts": 2, "final": "mean"},
               "paper": {"iterations": 1500, "restarts": 4, "final": "mean"}}
    Options = IGOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels", "local_training", "prior_data"})

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        opt = self.options
        yield from pixel_rungs(obs, ctx, opt, opt.distance, halving=opt.halving)


def pixel_rungs(obs: Observation, ctx: AttackContext, opt, distance, *, halving: tuple[float, ...] = (),
                regulariser: GradientRegularisation | None = None, extras: tuple[str, ...] = ()
                ) -> Iterator[Reconstruction]:
    """Inverting Gradients' run — pixels in [0, 1] from `opt.init`, TV, signed Adam, restarts —
    matched by `distance` (a name of `update_distance` or a distance object), one
    Reconstruction per rung; shared with the attacks that change only the matching or the step
    (`fedleak`). `extras`: further Outcome fields reported per rung."""
    sim = UpdateSimulator(obs, ctx.device, second_order=opt.second_order)
    labels = recover_labels(obs, opt.label_method, ctx.generator(17)).to(ctx.device)
    shape = (obs.batch_size, *obs.input_shape)
    image = obs.kind.picture_shape(obs.input_shape) is not None  # kept in [0, 1] and smooth
    engine = Engine(
        matching=Matching(sim, sim.target, distance), labels=FixedLabels(labels),
        candidates=lambda r: Pixels(
            observed_start(opt.init, shape, ctx.generator(r), obs, labels, ctx, learned=learned_start)
            .to(ctx.device), box=image),
        optimizer=Optimizer("signed-adam" if opt.signed else "adam", opt.lr,
                            schedule=opt.schedule),
        priors=[TotalVariation(opt.tv if image else 0.0)], iterations=opt.iterations, restarts=opt.restarts,
        final=opt.final, mean_within=opt.mean_within, joint=bool(halving), halving=halving, box=image,
        model=sim.model, progress=ctx.progress, deadline=ctx.deadline, regulariser=regulariser)
    for out in engine.start().doublings(opt.iterations):
        yield Reconstruction(inputs=out.inputs.cpu(), labels=labels.cpu(), iterations=out.iterations,
                             final_distance=out.distance, **out.trace_fields(),
                             extras={"restart_distances": out.restart_distances,
                                     "restarts_averaged": out.restarts_averaged,
                                     **{key: getattr(out, key) for key in extras}})
