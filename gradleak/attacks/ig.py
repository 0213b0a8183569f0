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

from dataclasses import dataclass
from typing import Literal

import torch

from ..options import check
from ..threat import Observation
from .base import Attack, AttackContext, Reconstruction
from .labels import recover_labels
from .matching import (
    SecondOrder,
    UpdateSimulator,
    finite_or_inf,
    random_init,
    registered_mean,
    step_decay_lr,
    total_variation,
    update_distance,
)


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
    distance: Literal["cosine", "l2", "l1"] = "cosine"
    init: Literal["randn", "rand", "gray"] = "randn"
    signed: bool = True
    decay: bool = True
    label_method: Literal["auto", "bias", "weight"] = "auto"
    # auto: the frozen-kink finite difference on convolutional models' FedSGD gradients
    # (attacks.finite_difference; 1.3–1.9× faster per iteration, same PSNR), else exact
    second_order: SecondOrder = "auto"

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'ig': iterations must be >= 1")
        check(self.lr > 0, "attack 'ig': lr must be > 0")
        check(self.tv >= 0, "attack 'ig': tv must be >= 0")
        check(self.restarts >= 1, "attack 'ig': restarts must be >= 1")
        check(self.mean_within >= 1, "attack 'ig': mean_within must be >= 1")


class InvertingGradients(Attack):
    """Inverting Gradients: cosine matching + TV, signed Adam, restarts."""

    name = "ig"
    budgets = {"quick": {"iterations": 1000}, "thorough": {"iterations": 2500, "restarts": 4, "final": "mean"}}
    Options = IGOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels", "local_training", "prior_data"})

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        sim = UpdateSimulator(obs, ctx.device, second_order=opt.second_order)
        labels = recover_labels(obs, opt.label_method, ctx.generator(17)).to(ctx.device)
        shape = (obs.batch_size, *obs.input_shape)
        image = obs.modality == "image"
        results, trace = [], []
        for restart in range(opt.restarts):
            x = random_init(shape, opt.init, ctx.generator(restart)).to(ctx.device)
            if image:
                x = x.clamp(0, 1)
            x.requires_grad_(True)
            optimizer = torch.optim.Adam([x], lr=opt.lr)
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer, step_decay_lr(opt.iterations) if opt.decay else (lambda _: 1.0))
            for it in range(opt.iterations):
                optimizer.zero_grad(set_to_none=True)
                distance = update_distance(sim(x, labels), sim.target, opt.distance)
                loss = distance + (opt.tv * total_variation(x) if image and opt.tv else 0.0)
                loss.backward(inputs=[x])  # skip the simulator's weights
                if opt.signed:
                    x.grad.sign_()
                optimizer.step()
                schedule.step()
                if image:
                    with torch.no_grad():
                        x.clamp_(0, 1)
                if it % 50 == 0 or it == opt.iterations - 1:
                    trace.append(float(distance.detach()))
                    if ctx.progress:
                        ctx.progress(restart * opt.iterations + it + 1,
                                     opt.restarts * opt.iterations, float(distance.detach()))
            results.append((finite_or_inf(update_distance(sim(x, labels), sim.target, opt.distance)),
                            x.detach()))
        finals = [distance for distance, _ in results]
        final, inputs = min(results, key=lambda r: r[0])
        averaged = 1
        if opt.final == "mean":
            # the best restart first: the others are registered to it
            close = [x for d, x in sorted(results, key=lambda r: r[0]) if d <= opt.mean_within * final]
            averaged = len(close)
            if averaged > 1:
                inputs = registered_mean(close, labels)
                if image:
                    inputs = inputs.clamp(0, 1)
                final = finite_or_inf(update_distance(sim(inputs, labels), sim.target, opt.distance))
        return Reconstruction(inputs=inputs.cpu(), labels=labels.cpu(),
                              iterations=opt.iterations * opt.restarts, final_distance=final, trace=trace,
                              extras={"restart_distances": finals, "restarts_averaged": averaged})
