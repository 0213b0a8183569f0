"""The optimisation loop shared by DLG and CPL: L-BFGS, Adam or SGD over the
attack's variables, stopping at a maximum iteration count or as soon as the
gradient distance falls to a threshold (CPL's termination condition T).

One iteration is one `optimizer.step`; for L-BFGS that step runs up to
`inner` function evaluations (torch's `max_iter`; the DLG/CPL reference code
uses torch's default of 20), which is how the papers count L-BFGS iterations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from ..fl.update import Update
from .matching import finite_or_inf

OptimizerKind = Literal["lbfgs", "adam", "sgd"]
# objective() -> (loss to minimise, gradient distance used for termination)
Objective = Callable[[], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class LoopResult:
    iterations: int  # optimizer steps taken (until the threshold, if reached)
    converged: bool  # gradient distance <= threshold
    distance: float  # final gradient distance (inf if it diverged)
    trace: list[float] = field(default_factory=list)


def make_optimizer(kind: OptimizerKind, variables: list[torch.Tensor], lr: float, *,
                   history_size: int = 100, inner: int = 20, line_search: bool = False
                   ) -> torch.optim.Optimizer:
    if kind == "lbfgs":
        return torch.optim.LBFGS(variables, lr=lr, max_iter=inner, history_size=history_size,
                                 line_search_fn="strong_wolfe" if line_search else None)
    if kind == "adam":
        return torch.optim.Adam(variables, lr=lr)
    return torch.optim.SGD(variables, lr=lr, momentum=0.9)


def minimise(objective: Objective, optimizer: torch.optim.Optimizer, iterations: int,
             threshold: float = 0.0, progress: Callable[[int, int, float], None] | None = None
             ) -> LoopResult:
    """Run `optimizer` on `objective` for at most `iterations` steps; stop early
    once the distance is <= threshold (threshold 0 disables early stopping)."""
    lbfgs = isinstance(optimizer, torch.optim.LBFGS)
    trace: list[float] = []
    last = [float("inf")]
    variables = [p for group in optimizer.param_groups for p in group["params"]]

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss, distance = objective()
        loss.backward(inputs=variables)  # skip the simulator's weights
        last[0] = finite_or_inf(distance)
        return loss

    def reached(value: float) -> bool:
        return threshold > 0 and value <= threshold

    steps = 0
    for it in range(iterations):
        if lbfgs:
            optimizer.step(closure)
            steps = it + 1
            # the distance at the point L-BFGS stopped (its last evaluation may precede the last update)
            with torch.enable_grad():
                current = finite_or_inf(objective()[1])
        else:
            closure()
            current = last[0]
            if reached(current):
                break  # the current point already satisfies T: no further step
            optimizer.step()
            steps = it + 1
        trace.append(current)
        if progress:
            progress(it + 1, iterations, current)
        if not math.isfinite(current) or reached(current):
            break
    if not lbfgs:  # distance at the returned point
        with torch.enable_grad():
            current = finite_or_inf(objective()[1])
    return LoopResult(steps, reached(current), current, trace)


def gradient_scale(update: Update) -> float:
    """Factor turning an update into gradient units (Algorithm 1 of Wei et al.,
    lines 4-6: Δw / η), so distance thresholds mean the same for deltas."""
    return 1.0 if update.kind == "gradient" else 1.0 / (update.lr * max(update.steps, 1))
