"""GradInversion (Yin et al., "See through Gradients", CVPR 2021).

Gradient matching (cosine or L2) plus image priors: total variation, an l2
penalty, and the batch-norm prior — the per-layer mean and variance of the
candidate batch are pulled to the BN statistics of the client's batch, which the
threat model must reveal (`bn_statistics`) or the client's sent batch-norm buffers give
(`gradleak.fl.buffers`). Group consistency: several restarts
(one seed each) are optimised together; after registering each to the first
(rows with the same label are matched by the Hungarian algorithm — no spatial
warping), every member is regularised toward the group mean. The result is the
registered group mean or the member whose update matches best.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ...errors import GradleakError
from ...options import check
from ...threat import Observation
from ..base import AttackContext, Reconstruction, ResumableAttack
from ..engine.candidates import FixedLabels, Pixels
from ..engine.engine import Engine, Optimizer, plain_forward
from ..engine.initialization import InitKind, observed_start
from ..engine.objectives import BNStatistics, GroupConsistency, L2Norm, Matching, TotalVariation
from ..learned.learned import learned_start
from ..replay.labels import recover_labels
from ..replay.matching import UpdateSimulator


@dataclass
class GradInversionOptions:
    iterations: int = 1000
    lr: float = 0.1
    distance: Literal["cosine", "l2"] = "cosine"
    # weight of the BN-statistics prior (0: off, then bn_statistics is not needed); chosen on
    # imagenet-samples at 32 px (`python -m benchmarks optim` prints it against bn=0 and IG)
    bn: float = 0.1
    tv: float = 1e-4
    l2: float = 1e-6
    restarts: int = 3  # group size (one seed each)
    group: float = 0.01  # weight of ‖x − registered group mean‖² (0: independent restarts)
    group_start: float = 0.25  # fraction of the run before group consistency kicks in
    final: Literal["mean", "best"] = "best"
    init: InitKind = "randn"
    signed: bool = False  # Adam on the sign of the gradient, as Inverting Gradients
    label_method: Literal["auto", "bias", "weight"] = "auto"

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'gradinversion': iterations must be >= 1")
        check(self.lr > 0, "attack 'gradinversion': lr must be > 0")
        for key in ("bn", "tv", "l2", "group"):
            check(getattr(self, key) >= 0, f"attack 'gradinversion': {key} must be >= 0")
        check(self.restarts >= 1, "attack 'gradinversion': restarts must be >= 1")
        check(0 <= self.group_start <= 1, "attack 'gradinversion': group_start must be in [0, 1]")


class GradInversion(ResumableAttack):
    """GradInversion: gradient matching + BN-statistics, TV, l2 priors + group consistency."""

    name = "gradinversion"
    budgets = {"quick": {"iterations": 500}, "thorough": {"iterations": 2000}}
    Options = GradInversionOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels", "local_training", "bn_statistics", "prior_data"})
    modalities = ("image",)

    def unsupported(self, model, input_shape, num_classes, modality):
        if self.options.bn > 0 and not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            return "needs batch-norm layers for its BN-statistics prior (the model has none); use bn=0"
        return super().unsupported(model, input_shape, num_classes, modality)

    def needs(self) -> frozenset[str]:
        extra = frozenset({"bn_statistics"}) if self.options.bn > 0 else frozenset()
        return super().needs() | extra

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        opt = self.options
        sim = UpdateSimulator(obs, ctx.device)
        labels = recover_labels(obs, opt.label_method, ctx.generator(17)).to(ctx.device)
        batch = obs.batch_size
        shape = (batch, *obs.input_shape)
        # the first local step sees the whole batch unless the client trains on mini-batches
        bn_from_update = sim.training.step_batch_size(batch) == batch
        priors = [TotalVariation(opt.tv), L2Norm(opt.l2),
                  BNStatistics(opt.bn, self._bn_target(obs, ctx.device) if opt.bn > 0 else [], bn_from_update),
                  GroupConsistency(opt.group if opt.restarts > 1 else 0.0, opt.group_start)]
        engine = Engine(
            matching=Matching(sim, sim.target, opt.distance), labels=FixedLabels(labels),
            candidates=lambda r: Pixels(
                observed_start(opt.init, shape, ctx.generator(r), obs, labels, ctx, learned=learned_start)
                .to(ctx.device), box=True),
            optimizer=Optimizer("signed-adam" if opt.signed else "adam", opt.lr, schedule="step"), priors=priors,
            iterations=opt.iterations, restarts=opt.restarts, joint=True, final=opt.final, box=True,
            model=sim.model, forward=plain_forward(sim.model, sim.params, sim.buffers), progress=ctx.progress,
            deadline=ctx.deadline)
        for out in engine.start().doublings(opt.iterations):
            yield Reconstruction(inputs=out.inputs.cpu(), labels=labels.cpu(), iterations=out.iterations,
                                 final_distance=out.distance, **out.trace_fields(),
                                 extras={"restart_distances": out.restart_distances})

    @staticmethod
    def _bn_target(obs: Observation, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        stats = obs.get("bn_statistics")
        if not stats:
            raise GradleakError("attack 'gradinversion': the model has no batch-norm layer, so there are "
                                "no BN statistics to match; use bn=0")
        return [(m.to(device), v.to(device)) for m, v in stats]

