"""Deep Leakage from Gradients (Zhu et al., NeurIPS 2019).

Dummy data and a dummy label logit vector are optimised jointly with L-BFGS so
that the update they produce — the FedSGD gradient, or the FedAvg delta replayed
over the client's τ local steps (`UpdateSimulator`, which accepts soft labels) —
matches the observed one in squared L2 distance. The label is softmax(logits);
the reported label is its argmax.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...options import check
from ...threat import Observation
from ..base import AttackContext, Reconstruction, ResumableAttack
from ..engine.candidates import Pixels, SoftLabels
from ..engine.engine import Engine, Optimizer
from ..engine.initialization import InitKind, initial_inputs
from ..engine.objectives import Matching
from ..replay.matching import SecondOrder, UpdateSimulator, gradient_scale


@dataclass
class DLGOptions:
    iterations: int = 300  # L-BFGS iterations (DLG's default)
    lr: float = 1.0
    init: InitKind = "random"  # random: randn, as DLG's code
    inner: int = 20  # L-BFGS function evaluations per iteration (torch default, as in DLG's code)
    history_size: int = 100
    line_search: bool = False
    threshold: float = 0.0  # stop once the gradient distance is <= this (0: run all iterations)
    # auto: the frozen-kink finite difference on convolutional models' FedSGD gradients
    # (attacks.replay.finite_difference; cheaper per iteration, same L-BFGS result), else exact
    second_order: SecondOrder = "auto"

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'dlg': iterations must be >= 1")
        check(self.lr > 0, "attack 'dlg': lr must be > 0")
        check(self.inner >= 1, "attack 'dlg': inner must be >= 1")
        check(self.history_size >= 1, "attack 'dlg': history_size must be >= 1")
        check(self.threshold >= 0, "attack 'dlg': threshold must be >= 0")
        check(self.init != "optimal", "attack 'dlg': init=optimal needs the labels before the optimisation "
                                      "starts, and DLG learns them as it goes")


class DLG(ResumableAttack):
    """DLG: joint L-BFGS over dummy data and soft labels, L2 update matching."""

    name = "dlg"
    budgets = {"quick": {"iterations": 150}, "thorough": {"iterations": 600}}
    Options = DLGOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"local_training"})

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        opt = self.options
        sim = UpdateSimulator(obs, ctx.device, second_order=opt.second_order)
        shape = (obs.batch_size, *obs.input_shape)
        labels = SoftLabels(torch.randn((obs.batch_size, obs.num_classes), generator=ctx.generator(1)).to(ctx.device))
        engine = Engine(
            matching=Matching(sim, sim.target, "l2", scale=gradient_scale(obs.update)), labels=labels,
            candidates=lambda r: Pixels(initial_inputs(opt.init, shape, ctx.generator(0)).to(ctx.device)),
            optimizer=Optimizer("lbfgs", opt.lr, inner=opt.inner, history=opt.history_size,
                                line_search=opt.line_search),
            iterations=opt.iterations, threshold=opt.threshold, model=sim.model, trace_every=1,
            progress=ctx.progress, deadline=ctx.deadline)
        for out in engine.start().doublings(opt.iterations):
            yield Reconstruction(inputs=out.inputs.cpu(), labels=out.labels.cpu(), iterations=out.iterations,
                                 converged=out.converged, final_distance=out.distance, **out.trace_fields())
