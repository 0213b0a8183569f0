"""GradInversion (Yin et al., "See through Gradients", CVPR 2021).

Gradient matching (cosine or L2) plus image priors: total variation, an l2
penalty, and the batch-norm prior — the per-layer mean and variance of the
candidate batch are pulled to the BN statistics of the client's batch, which the
threat model must reveal (`bn_statistics`). Group consistency: several restarts
(one seed each) are optimised together; after registering each to the first
(rows with the same label are matched by the Hungarian algorithm — no spatial
warping), every member is regularised toward the group mean. The result is the
registered group mean or the member whose update matches best.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call

from ..errors import GradleakError
from ..options import check
from ..threat import Observation
from .base import Attack, AttackContext, Reconstruction
from .initialization import initial_inputs
from .labels import recover_labels
from .matching import UpdateSimulator, finite_or_inf, registered_mean, step_decay_lr, total_variation, update_distance


@dataclass
class GradInversionOptions:
    iterations: int = 1000
    lr: float = 0.1
    distance: Literal["cosine", "l2"] = "cosine"
    bn: float = 0.01  # weight of the BN-statistics prior (0: off, then bn_statistics is not needed)
    tv: float = 1e-4
    l2: float = 1e-6
    restarts: int = 3  # group size (one seed each)
    group: float = 0.01  # weight of ‖x − registered group mean‖² (0: independent restarts)
    group_start: float = 0.25  # fraction of the run before group consistency kicks in
    final: Literal["mean", "best"] = "best"
    init: Literal["randn", "random", "uniform", "gray"] = "randn"
    label_method: Literal["auto", "bias", "weight"] = "auto"

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'gradinversion': iterations must be >= 1")
        check(self.lr > 0, "attack 'gradinversion': lr must be > 0")
        for key in ("bn", "tv", "l2", "group"):
            check(getattr(self, key) >= 0, f"attack 'gradinversion': {key} must be >= 0")
        check(self.restarts >= 1, "attack 'gradinversion': restarts must be >= 1")
        check(0 <= self.group_start <= 1, "attack 'gradinversion': group_start must be in [0, 1]")


class GradInversion(Attack):
    """GradInversion: gradient matching + BN-statistics, TV, l2 priors + group consistency."""

    name = "gradinversion"
    budgets = {"quick": {"iterations": 500}, "thorough": {"iterations": 2000}}
    Options = GradInversionOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels", "local_training", "bn_statistics"})
    modalities = ("image",)

    def unsupported(self, model, input_shape, num_classes, modality):
        if self.options.bn > 0 and not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            return "needs batch-norm layers for its BN-statistics prior (the model has none); use bn=0"
        return super().unsupported(model, input_shape, num_classes, modality)

    def needs(self) -> frozenset[str]:  # type: ignore[override]
        extra = frozenset({"bn_statistics"}) if self.options.bn > 0 else frozenset()
        return super().needs() | extra

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        sim = UpdateSimulator(obs, ctx.device)
        labels = recover_labels(obs, opt.label_method, ctx.generator(17)).to(ctx.device)
        batch = obs.batch_size
        bn_target = self._bn_target(obs, ctx.device) if opt.bn > 0 else []
        bn_layers = [m for m in sim.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        # the first local step sees the whole batch unless the client trains on mini-batches
        bn_from_step = sim.training.step_batch_size(batch) == batch
        group = [initial_inputs(opt.init, (batch, *obs.input_shape), ctx.generator(r)).to(ctx.device)
                 .clamp(0, 1).requires_grad_(True) for r in range(opt.restarts)]
        optimizer = torch.optim.Adam(group, lr=opt.lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, step_decay_lr(opt.iterations))
        group_from = int(opt.group_start * opt.iterations)
        trace: list[float] = []

        def member_loss(x: torch.Tensor, mean: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            captured: list[tuple[torch.Tensor, torch.Tensor]] = []
            handles = [m.register_forward_hook(_stats_hook(captured)) for m in bn_layers] if bn_target else []
            try:
                candidate = sim(x, labels)
                if bn_target and not bn_from_step:
                    captured.clear()
                    functional_call(sim.model, (sim.params, {k: v.clone() for k, v in sim.buffers.items()}), (x,))
            finally:
                for h in handles:
                    h.remove()
            distance = update_distance(candidate, sim.target, opt.distance)
            loss = distance + opt.tv * total_variation(x) + opt.l2 * x.pow(2).mean()
            if bn_target:
                loss = loss + opt.bn * sum((mu - m).norm() + (var - v).norm()
                                           for (mu, var), (m, v) in zip(captured[:len(bn_target)], bn_target))
            if mean is not None:
                loss = loss + opt.group * (x - mean).pow(2).mean()
            return loss, distance

        for it in range(opt.iterations):
            optimizer.zero_grad(set_to_none=True)
            mean = registered_mean(group, labels) if opt.group and opt.restarts > 1 and it >= group_from else None
            distances = []
            for x in group:
                loss, distance = member_loss(x, mean)
                loss.backward(inputs=group)  # skip the simulator's weights
                distances.append(float(distance.detach()))
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                for x in group:
                    x.clamp_(0, 1)
            if it % 50 == 0 or it == opt.iterations - 1:
                trace.append(min(distances))
                if ctx.progress:
                    ctx.progress(it + 1, opt.iterations, min(distances))

        finals = [finite_or_inf(update_distance(sim(x, labels), sim.target, opt.distance)) for x in group]
        best = min(range(len(group)), key=finals.__getitem__)
        if opt.final == "mean" and len(group) > 1:
            inputs = registered_mean(group, labels).clamp(0, 1)
            final = finite_or_inf(update_distance(sim(inputs, labels), sim.target, opt.distance))
        else:
            inputs, final = group[best].detach(), finals[best]
        return Reconstruction(inputs=inputs.cpu(), labels=labels.cpu(), iterations=opt.iterations,
                              final_distance=final, trace=trace, extras={"restart_distances": finals})

    @staticmethod
    def _bn_target(obs: Observation, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        stats = obs.get("bn_statistics")
        if not stats:
            raise GradleakError("attack 'gradinversion': the model has no batch-norm layer, so there are "
                                "no BN statistics to match; use bn=0")
        return [(m.to(device), v.to(device)) for m, v in stats]


def _stats_hook(captured: list):
    def hook(_module, inputs, _output):
        h = inputs[0]
        dims = [0] + list(range(2, h.dim()))
        captured.append((h.mean(dims), h.var(dims, unbiased=False)))
    return hook
