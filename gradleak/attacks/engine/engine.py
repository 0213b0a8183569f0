"""The one optimisation engine of the gradient-matching attacks.

An attack is a configuration of it (the design of breaching, Geiping et al.):

- a **candidate**: what is optimised and how it becomes inputs — `Pixels` (the
  inputs themselves, optionally kept in [0, 1]), `Latent` (a low-dimensional code
  and a decoder, ROG), `Network` (the weights of an untrained generator, a deep
  image prior); labels are fixed (`FixedLabels`) or optimised with the inputs
  (`SoftLabels`, DLG); `Embeddings` (input embeddings of a token sequence, TAG and LAMP)
  with labels guessed from the candidate as it goes (`GuessedLabels`);
- an **objective**: `Matching` — the distance between the update the client would
  send for the candidate and the observed one (L2, cosine, weighted or per-layer
  cosine, FedLeak's partial matching `PartialDistance`, or an attack's own, e.g. ROG's
  sign matching), optionally with FedLeak's `GradientRegularisation` of each step (a
  second gradient at a probe point mixed into the step's);
- **priors** added to it with their weights: `TotalVariation`, `BNStatistics`,
  `L2Norm`, `GroupConsistency`, `LabelConfidence`, `EmbeddingNorm` (LAMP), or an
  attack's own `Prior` (feature matching);
- an **optimizer and schedule** (`Optimizer`): signed Adam, Adam, SGD or L-BFGS;
  step decay, cosine annealing, exponential decay or constant;
- **hooks** (`Hook`): every N iterations, a call on the candidate between steps — labels
  guessed from it (TAG's next tokens), discrete moves of its variables (LAMP's
  rearrangements);
- **restarts** (one after another, or optimised jointly as a group) and how the
  result is chosen: the restart whose update matches best, or the registered
  mean of those that match almost as well;
- a **budget and stop rule** (iterations; a distance threshold, CPL's T).

Every run reports whether it converged (when a threshold was set), its final
matching distance and a trace of the distance with its iteration and wall time,
so sweeps and reports can tell a defense that held from a budget that ran out.

Over 400 lines: the engine's loop (`Engine`) and its run state (`EngineRun`) share private
helpers and are read together.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call

from ...errors import GradleakError
from ..replay.matching import finite_or_inf, registered_mean
from .candidates import Candidate, FixedLabels, Pixels
from .lbfgs import GramLBFGS
from .objectives import GradientRegularisation, GroupConsistency, Matching, Prior, Seen

Tensors = Mapping[str, torch.Tensor]
OptimizerKind = Literal["signed-adam", "adam", "sgd", "lbfgs"]
ScheduleKind = Literal["step", "cosine", "exponential", "constant"]


@dataclass
class Optimizer:
    """Optimizer and schedule. L-BFGS: `inner` function evaluations per iteration
    (torch's max_iter; how DLG and CPL count iterations), `history`, an optional
    strong-Wolfe line search, `tolerances=False` to never stop on torch's absolute
    gradient and change tolerances."""

    kind: OptimizerKind = "signed-adam"
    lr: float = 0.1
    schedule: ScheduleKind = "constant"
    final_lr: float = 0.1  # cosine: anneal to lr × final_lr; exponential: decay to it at the last step
    inner: int = 20
    history: int = 100
    line_search: bool = False
    tolerances: bool = True

    def build(self, variables: list[torch.Tensor]) -> torch.optim.Optimizer:
        if self.kind == "lbfgs":
            extra = {} if self.tolerances else {"tolerance_grad": 0.0, "tolerance_change": 0.0}
            return GramLBFGS(variables, lr=self.lr, max_iter=self.inner, history_size=self.history,
                             line_search_fn="strong_wolfe" if self.line_search else None, **extra)
        if self.kind == "sgd":
            return torch.optim.SGD(variables, lr=self.lr, momentum=0.9)
        return torch.optim.Adam(variables, lr=self.lr)

    def schedule_for(self, optimizer: torch.optim.Optimizer, iterations: int, done: int = 0
                     ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """This schedule over `iterations` steps of `optimizer`, from its initial lr; with
        `done` > 0, the rest of the schedule of a run of `done + iterations` steps from step
        `done` on (a resumed run continues as if its longer budget had been planned; an
        exponential decay stays at the rate it reached, lr × final_lr, as LAMP's does)."""
        if done:
            total = done + iterations
            if self.schedule == "exponential":
                return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: self.final_lr)
            if self.schedule == "step":
                factor = step_decay_lr(total)
            elif self.schedule == "cosine":
                factor = lambda it: self.final_lr + (1 - self.final_lr) * (1 + math.cos(math.pi * it / total)) / 2  # noqa: E731
            else:
                return None
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: factor(done + it))
        if self.schedule == "step":
            return torch.optim.lr_scheduler.LambdaLR(optimizer, step_decay_lr(iterations))
        if self.schedule == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, iterations,
                                                              eta_min=self.lr * self.final_lr)
        if self.schedule == "exponential":
            last = max(1, iterations - 1)
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: self.final_lr ** (min(it, last) / last))
        return None


def step_decay_lr(iterations: int) -> Callable[[int], float]:
    """×0.1 at 3/8, 5/8 and 7/8 of the run (Geiping et al.)."""
    milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    return lambda it: 0.1 ** sum(it >= m for m in milestones)


@dataclass
class Hook:
    """`call(candidate, iteration)` before the step of every `every`-th iteration from `start`
    on (iterations counted over the whole run, resumed segments included), without gradient
    tracking: it may replace what the candidate stands for in place (LAMP's rearrangements)
    or read it (labels guessed from it, TAG's next tokens). Hooks run in their order."""

    every: int
    call: Callable[[Candidate, int], None]
    start: int = 0

    def due(self, iteration: int) -> bool:
        return iteration >= self.start and (iteration - self.start) % self.every == 0


@dataclass
class TracePoint:
    iteration: int
    distance: float
    seconds: float


@dataclass
class Outcome:
    """What the engine returns: the chosen inputs and labels, the iterations it ran (all
    restarts together), whether the stop rule was met (None without a threshold), the
    final matching distance of the result, the trace of the best member, each
    restart's final distance and how many were averaged."""

    inputs: torch.Tensor
    labels: torch.Tensor
    iterations: int
    converged: bool | None
    distance: float
    trace: list[TracePoint]
    restart_distances: list[float]
    restarts_averaged: int = 1
    evaluations: int = 0

    def trace_fields(self) -> dict[str, list]:
        """The trace as `Reconstruction`'s parallel lists."""
        return {"trace": [p.distance for p in self.trace],
                "trace_iterations": [p.iteration for p in self.trace],
                "trace_seconds": [round(p.seconds, 3) for p in self.trace]}


@dataclass
class Engine:
    """One configured optimisation. `candidates(r)` builds restart r's candidate;
    `joint` optimises all restarts together as one group (each step updates every
    member; `GroupConsistency` sees the group's registered mean) instead of one
    after another. `final`: the best-matching restart, or the registered mean of the
    restarts whose final distance is ≤ `mean_within` × the best. `threshold` > 0
    stops as soon as the distance is ≤ it (converged). `keep_best`: return the
    best point evaluated rather than the last (line searches and Adam can step past
    it). `model`: the simulator's model, whose layers priors may watch. `regulariser`:
    FedLeak's gradient regularisation of each step (`GradientRegularisation`; not with
    L-BFGS)."""

    matching: Matching
    labels: FixedLabels
    candidates: Callable[[int], Candidate]
    optimizer: Optimizer = field(default_factory=Optimizer)
    priors: Sequence[Prior] = ()
    hooks: Sequence[Hook] = ()
    iterations: int = 1000
    restarts: int = 1
    joint: bool = False
    final: Literal["best", "mean"] = "best"
    mean_within: float = math.inf
    threshold: float = 0.0
    keep_best: bool = False
    loss_scale: float = 1.0  # multiplies the minimised loss only (CPL's normalised objective)
    model: nn.Module | None = None
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None  # a plain forward pass, for priors
    # joint groups: after each of these fractions of the run, only the better-matching half
    # of the members still running goes on (successive halving)
    halving: Sequence[float] = ()
    trace_every: int = 50
    progress: Callable[[int, int, float], None] | None = None
    progress_offset: int = 0  # iterations done by earlier stages of the same attack (ROG's refinement)
    progress_total: int | None = None
    started: float | None = None  # time.perf_counter() the trace's seconds count from (default: this run's start)
    box: bool = False  # clamp the registered mean to [0, 1]
    regulariser: GradientRegularisation | None = None
    # time.perf_counter() past which the run stops where it is (AttackContext.deadline)
    deadline: float | None = None

    def run(self) -> Outcome:
        """The configured run: `iterations` per restart."""
        return self.start().advance(self.iterations)

    def start(self) -> "EngineRun":
        """A run that can be advanced step by step and resumed: `advance(n)` optimises every
        restart `n` more iterations from where the last call left it (the auditor's budget
        ladder doubles the budget this way without starting over)."""
        return EngineRun(self)

    # one evaluation of the objective -------------------------------------------------
    def _evaluate(self, candidate: Candidate, iteration: int, group_mean: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        for inputs in self._layer_inputs.values():
            inputs.clear()
        x = candidate.inputs()
        y = self.labels.current()
        distance = self.matching(x, y)
        loss = distance
        if self._priors:
            seen = Seen(x, self.labels.hard(), self._layer_inputs, iteration, self.iterations, group_mean,
                        self.forward)
            for prior in self._priors:
                term = prior(seen)
                if term is not None:
                    loss = loss + prior.weight * term
        self._evaluations += 1
        return loss * self.loss_scale if self.loss_scale != 1.0 else loss, distance

    def _distance(self, candidate: Candidate) -> float:
        with torch.enable_grad():  # the simulated update is itself a gradient
            for inputs in self._layer_inputs.values():
                inputs.clear()
            return finite_or_inf(self.matching(candidate.inputs(), self.labels.current()))

    # one segment of the optimisation of a group of candidates ------------------------------
    def _optimise(self, group: "_Group", iterations: int, total: int) -> int:
        """Optimise `group` `iterations` more steps (its schedule spans this segment; the
        optimizer's state carries over from the last segment); returns the steps taken.
        Updates the group's trace, members still running (see `halving`, first segment only)
        and whether the stop rule was met."""
        done = group.first_iteration + self.progress_offset
        total = self.progress_total or total
        lbfgs = self.optimizer.kind == "lbfgs"
        signed = self.optimizer.kind == "signed-adam"
        first = group.steps == 0
        if group.optimizer is None:
            variables = [v for c in group.active for v in c.variables()] + self.labels.variables()
            group.optimizer, group.variables = self.optimizer.build(variables), variables
        optimizer, variables = group.optimizer, group.variables
        for param_group in optimizer.param_groups:  # schedules scale the initial lr
            param_group["lr"] = param_group.setdefault("initial_lr", self.optimizer.lr)
        schedule = self.optimizer.schedule_for(optimizer, iterations, group.steps) if not lbfgs else None
        reached = lambda d: self.threshold > 0 and d <= self.threshold  # noqa: E731
        cuts = sorted({int(f * iterations) for f in self.halving if 0 < f < 1}) if first else []
        best = [math.inf, math.inf, [c.snapshot() for c in group.active]]  # loss, distance, variables
        active = group.active
        distances: list[float] = [math.inf] * len(active)
        steps = 0
        offset = group.steps
        track_best = self.keep_best and len(group.members) == 1

        def closure(probe: bool = False) -> torch.Tensor:
            """The objective's gradient at the current point; `probe`: at a look-ahead point of
            the gradient regularisation, whose distances are not the members' own."""
            optimizer.zero_grad(set_to_none=True)
            grouped = any(isinstance(p, GroupConsistency) and offset + steps >= int(p.start * self.iterations)
                          for p in self._priors)
            mean = registered_mean([c.inputs() for c in active], self.labels.hard()) \
                if grouped and len(active) > 1 else None
            total_loss = None
            for i, candidate in enumerate(active):
                loss, distance = self._evaluate(candidate, offset + steps, mean)
                # not the simulator's weights; members no longer running keep no gradient, so Adam skips them
                loss.backward(inputs=candidate.variables() + self.labels.variables())
                value = finite_or_inf(loss)
                total_loss = loss.detach() if total_loss is None else total_loss + loss.detach()
                if probe:
                    continue
                distances[i] = finite_or_inf(distance)
                if track_best and value < best[0]:
                    best[0], best[1], best[2] = value, distances[i], [candidate.snapshot()]
            return total_loss

        step_seconds = 0.0  # the last iteration's: one that would end past the deadline is not begun
        for it in range(iterations):
            began = time.perf_counter()
            if self.deadline is not None and began + step_seconds > self.deadline:
                group.out_of_time = True
                break
            due = [hook for hook in self.hooks if hook.due(offset + it)]
            if due:
                with torch.no_grad():
                    for hook in due:
                        for candidate in active:
                            hook.call(candidate, offset + it)
            if lbfgs:
                optimizer.step(closure)
                steps = it + 1
                current = min(distances)
                if self.threshold > 0:  # the stop rule needs the distance at the point L-BFGS stopped
                    current = min(self._distance(c) for c in active)
            else:
                loss = closure()
                current = min(distances)
                if reached(current):
                    group.converged = True
                    break  # the current point already meets the stop rule: no further step
                if signed:
                    _sign(variables)
                if self.regulariser is not None and self.regulariser.weight > 0:
                    self._regularise(optimizer, variables, active, closure, signed)
                optimizer.step()
                if schedule is not None:
                    schedule.step()
                steps = it + 1
                if not math.isfinite(finite_or_inf(loss)):
                    current = math.inf
            for candidate in active:
                candidate.project()
            step_seconds = time.perf_counter() - began
            if it % self.trace_every == 0 or it == iterations - 1:
                group.trace.append(TracePoint(done + offset + it + 1, current, time.perf_counter() - self._start))
                if self.progress:
                    self.progress(done + offset + it + 1, total, current)
            if not math.isfinite(current):
                group.diverged = True
                break
            if reached(current):
                group.converged = True
                break
            if steps in cuts and len(active) > 1:
                # successive halving: the better-matching half (by the distance the server sees) goes on
                keep = sorted(range(len(active)), key=distances.__getitem__)[:math.ceil(len(active) / 2)]
                active[:] = [active[i] for i in sorted(keep)]
                distances = [distances[i] for i in sorted(keep)]
        if track_best and math.isfinite(best[0]):
            group.members[0].restore(best[2][0])
            # the optimizer's memory describes the point it left, not the one restored
            group.optimizer = None
        if self.threshold > 0 and not group.converged and not lbfgs:
            group.converged = reached(self._distance(active[0])) if len(active) == 1 else False
        group.steps += steps
        return steps

    def _regularise(self, optimizer: torch.optim.Optimizer, variables: list[torch.Tensor],
                    active: list[Candidate], closure: Callable[..., torch.Tensor], signed: bool) -> None:
        """Replace the gradients in `variables` (those at the current point v) by FedLeak's mix
        (1 − w)·g(v) + w·g(v + Δ) (see `GradientRegularisation`), leaving v and the
        optimizer's state as they were, so that the one real step that follows is the only one
        its moments and the schedule count."""
        reg = self.regulariser
        assert reg is not None
        here = [v.detach().clone() for v in variables]
        grads = [None if v.grad is None else v.grad.detach().clone() for v in variables]
        if reg.probe == "step":
            # the step the optimizer would take: taken on a copy of its state, then undone
            state = {v: {k: s.clone() if torch.is_tensor(s) else s for k, s in optimizer.state[v].items()}
                     for v in variables if v in optimizer.state}
            optimizer.step()
            for v in variables:
                if v in state:
                    optimizer.state[v] = state[v]
                else:
                    optimizer.state.pop(v, None)
        else:
            norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads if g is not None)) or 1.0
            with torch.no_grad():
                for v, g in zip(variables, grads):
                    if g is not None:
                        v.add_(g, alpha=reg.radius / norm)
        for candidate in active:
            candidate.project()  # the probe stays where candidates may be (pixels in [0, 1])
        closure(probe=True)
        if signed:
            _sign(variables)
        with torch.no_grad():
            for v, start, g in zip(variables, here, grads):
                v.copy_(start)
                if g is None:
                    continue
                mixed = g.mul_(1 - reg.weight)
                if v.grad is not None:
                    mixed.add_(v.grad, alpha=reg.weight)
                v.grad = mixed

    # the result -------------------------------------------------------------------
    def _choose(self, members: list[Candidate], traces: list[list[TracePoint]], steps: int,
                converged: bool) -> Outcome:
        labels = self.labels.hard()
        finals = [self._distance(c) for c in members]
        best = min(range(len(members)), key=finals.__getitem__)
        inputs = members[best].inputs().detach().clone()  # the run may go on and move the candidate
        distance = finals[best]
        averaged = 1
        if self.final == "mean" and len(members) > 1:
            # the best restart first: the others are registered to it
            order = sorted(range(len(members)), key=finals.__getitem__)
            close = [members[i].inputs().detach() for i in order if finals[i] <= self.mean_within * finals[best]]
            averaged = len(close)
            if averaged > 1:
                inputs = registered_mean(close, labels)
                if self.box:
                    inputs = inputs.clamp(0, 1)
                distance = self._distance(Pixels(inputs))
        return Outcome(inputs=inputs, labels=labels, iterations=steps,
                       converged=(converged or (self.threshold > 0 and distance <= self.threshold))
                       if self.threshold > 0 else None,
                       distance=distance, trace=list(traces[best]), restart_distances=finals,
                       restarts_averaged=averaged, evaluations=self._evaluations)


@dataclass
class _Group:
    """Candidates optimised together by one optimizer (one restart, or a joint group), and
    what carries over from one segment of the run to the next."""

    members: list[Candidate]
    active: list[Candidate]
    optimizer: torch.optim.Optimizer | None = None
    variables: list[torch.Tensor] = field(default_factory=list)
    trace: list[TracePoint] = field(default_factory=list)
    steps: int = 0
    converged: bool = False
    diverged: bool = False
    out_of_time: bool = False  # stopped at the engine's deadline
    first_iteration: int = 0  # where this group's iterations start in the run's count (restarts in turn)


class EngineRun:
    """An `Engine` run in segments (see `Engine.start`)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        engine._evaluations, engine._start = 0, engine.started if engine.started is not None else time.perf_counter()
        engine._priors = [p for p in engine.priors if p.weight]
        if engine.regulariser is not None and engine.regulariser.weight > 0 and engine.optimizer.kind == "lbfgs":
            # L-BFGS evaluates its own points inside a step: there is no single gradient to mix
            raise GradleakError("gradient regularisation needs a first-order optimizer, not lbfgs")
        engine._layer_inputs = {}
        self.groups: list[_Group] = []

    def advance(self, iterations: int) -> Outcome:
        """Optimise every restart `iterations` more steps; the result so far."""
        engine = self.engine
        watched = {m for p in engine._priors for m in p.watch(engine.model)}
        engine._layer_inputs = {m: [] for m in watched}
        handles = [m.register_forward_hook(_recorder(engine._layer_inputs[m])) for m in watched]
        try:
            if not self.groups and engine.joint:
                group = [engine.candidates(r) for r in range(engine.restarts)]
                self.groups = [_Group(group, list(group))]
            # the progress bar's total: every restart's iterations so far and in this segment
            done = max((g.steps for g in self.groups), default=0)
            total = (done + iterations) * (1 if engine.joint else engine.restarts)
            if engine.joint:
                self._segment(self.groups[0], iterations, total)
            else:
                for restart in range(engine.restarts):
                    if restart == len(self.groups):  # the first segment builds each restart in turn
                        candidate = engine.candidates(restart)
                        self.groups.append(_Group([candidate], [candidate], first_iteration=restart * iterations))
                    self._segment(self.groups[restart], iterations, total)
            members = [c for g in self.groups for c in g.active] if engine.joint \
                else [g.members[0] for g in self.groups]
            traces = [self.groups[0].trace] * len(members) if engine.joint else [g.trace for g in self.groups]
            steps = sum(g.steps for g in self.groups)
            return engine._choose(members, traces, steps, any(g.converged for g in self.groups))
        finally:
            for handle in handles:
                handle.remove()

    def doublings(self, iterations: int) -> Iterator[Outcome]:
        """The outcome after `iterations` per restart, then after each doubling of the total."""
        done, step = 0, iterations
        while True:
            yield self.advance(step)
            done += step
            step = done

    def _segment(self, group: _Group, iterations: int, total: int) -> None:
        if group.converged or group.diverged:
            return
        self.engine._optimise(group, iterations, total)


def _sign(variables: list[torch.Tensor]) -> None:
    for v in variables:
        if v.grad is not None:
            v.grad.sign_()


def _recorder(store: list[torch.Tensor]):
    def hook(_module, inputs, _output):
        store.append(inputs[0])
    return hook


def plain_forward(model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]
                  ) -> Callable[[torch.Tensor], torch.Tensor]:
    """A forward pass of the model as sent (buffers copied, so running statistics stay)."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, (params, {k: v.clone() for k, v in buffers.items()}), (x,))
    return forward

