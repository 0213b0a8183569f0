"""The FedAvg attack of Dimitrov et al. ("Data Leakage in Federated Averaging", TMLR 2022).

A client that trains several local epochs sees every example once per epoch, in an order
the server may not know, perhaps augmented differently each time. The attack simulates the
client's whole local training — its optimizer, label smoothing and clipping included
(`fl.local.local_update`) — on candidate data that holds one reconstruction of every
example per epoch, laid out as the client's mini-batches are:

- the order known (a cyclic order, or a shuffle whose seed the server knows): the k-th
  appearance of example i is copy k of example i;
- the order unknown: epoch e's copies are the examples of that epoch in an order of the
  attack's own, cut into mini-batches as the client cut its own; the optimisation decides
  which reconstruction lands in which mini-batch.

Copies of one example are tied by the paper's epoch-order-invariant prior: a function that
does not depend on the order — the mean of an epoch's copies — must agree from epoch to
epoch. The result registers every epoch's copies to the first epoch's (Hungarian matching
among examples of the same label, a horizontal flip allowed when the client flips) and
averages them. Labels are the batch's label counts recovered from the update, in the same
arrangement in every epoch: where the server knows the order and the arrangements over the
mini-batches are few, each is a candidate of its own and the closest match chooses; otherwise
the arrangement is optimised with the inputs.

Many steps of plain SGD in an unknown order (Dimitrov et al.'s 10 epochs × 10 mini-batches)
are replayed instead by `epoch_replay`: one full-batch step per epoch on one reconstruction
per example, which the order only perturbs at second order in the learning rate (`replay`).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from scipy.optimize import linear_sum_assignment

from ...fl.training import TrainingSpec
from ...options import check
from ...threat import Observation
from ..base import AttackContext, Reconstruction, ResumableAttack
from ..engine.candidates import ArrangedLabels, FixedLabels, Pixels
from ..engine.engine import Engine, Optimizer, Outcome, ScheduleKind
from ..engine.initialization import InitKind, observed_start
from ..engine.objectives import Matching, Prior, Seen, TotalVariation
from ..replay.epoch_replay import MAX_ORDER_SHARE, EpochReplay, applies, order_share, plain_training
from ..replay.labels import label_candidates, recover_labels
from ..replay.matching import UpdateSimulator

# function evaluations per L-BFGS iteration of the polish (torch's default max_iter, as DLG's)
POLISH_EVALUATIONS = 20


@dataclass
class FedAvgOptions:
    # Signed Adam on cosine matching with a light TV prior, as IG (docs/client-training.md)
    iterations: int = 2000
    lr: float = 0.1
    # the engine's optimizer (signed Adam as IG; L-BFGS as DLG, `lr` its step, 20 evaluations
    # an iteration)
    optimizer: Literal["signed-adam", "adam", "lbfgs"] = "signed-adam"
    tv: float = 1e-6
    # the closest label finalist runs its first rung again under this TV weight, and the closer
    # match of the two goes on (0: off). Which weight lets the matching converge depends on the
    # client: at a client lr of 0.1 a light prior can stall in salt-and-pepper noise that a
    # heavy one removes, and a heavy one can stall where the light one converges; a converged
    # match ends far closer than a stall, so the distance tells them apart
    # (docs/client-training.md)
    tv_alternative: float = 1e-3
    # weight of the epoch-order-invariant prior (mean squared difference of the epochs'
    # mean reconstructions); off by default, as it lowered PSNR at every weight tried
    # (docs/client-training.md)
    order_prior: float = 0.0
    # "auto": one copy per epoch when the server cannot replay the order or the client
    # augments, else one reconstruction per example (the exact replay, as IG's)
    copies: Literal["auto", "epochs", "shared"] = "auto"
    distance: Literal["cosine", "l2", "layer-cosine"] = "cosine"
    restarts: int = 1
    init: InitKind = "randn"
    schedule: ScheduleKind = "step"
    label_method: Literal["auto", "bias", "weight"] = "auto"
    # how the client's steps are simulated: "steps", every local step on the per-epoch copies
    # (`client_layout`); "epochs", one full-batch step per epoch on one reconstruction per
    # example (`epoch_replay`: order-free, plain SGD only); "auto": "epochs" where
    # `epoch_replay.applies` (plain SGD, order unknown, no augmentation, >= 16 steps) and the
    # order's share of the update is small under this distance (`order_share`), else "steps"
    replay: Literal["auto", "steps", "epochs"] = "auto"
    # optimise which recovered label sits in which mini-batch (`ArrangedLabels`); "auto": when
    # the client's steps see different parts of the batch and the server cannot place the
    # labels itself (they are recovered as counts, or the order is unknown)
    arrange_labels: Literal["auto", "on", "off"] = "auto"
    # where the labels need arranging ("auto"), the server knows the order, and the recovered
    # multiset has at most this many distinct arrangements over the client's mini-batches, each
    # arrangement is a label candidate of its own, placed rather than optimised: the soft
    # arrangement can settle on a wrong one, and at a client lr of 0.1 the matching then stalls
    # (docs/client-training.md). The closest placed finalist's multiset also runs with its
    # arrangement optimised, as one more finalist. 0: only the soft arrangement
    placed_arrangements: int = 12
    # labels recovered as counts can be off by one in how many of a class the batch holds.
    # "swaps": the count estimate and every multiset one label away (`labels.label_candidates`);
    # "auto": the estimate and only the multisets one label away that hold exactly the classes
    # the head's rows show present (`labels.present_classes`; none where every present class is one example, or
    # the rule does not apply); "off": the estimate alone. Where more than label_finalists
    # candidates remain, each is matched label_trial_iterations first; the finalists then run
    # the attack's first rung in full (polish included) and the closest match goes on, so the
    # winner's run is not repeated (docs/client-training.md)
    label_trials: Literal["auto", "off", "swaps"] = "auto"
    label_trial_iterations: int = 40
    label_finalists: int = 3
    # after every rung, L-BFGS (strong-Wolfe line search) on the matching distance alone from
    # the rung's result, the labels fixed as arranged, and the better-matching of the two kept:
    # signed Adam finds the basin but stalls in it (docs/client-training.md). Its budget, as a
    # share of the rung's iterations in function evaluations: ceil(polish × iterations / 20)
    # L-BFGS iterations of up to 20 evaluations each (400 at 2,000 iterations; it stops earlier
    # once converged); 0: off. 4 by default: at a client lr of 0.1, signed Adam alone needed
    # 8,000 iterations for what 2,000 and this polish reach (docs/client-training.md); the
    # budget presets keep the lighter 0.5 that audits of hundreds of examples can afford
    polish: float = 4.0

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'fedavg': iterations must be >= 1")
        check(self.lr > 0, "attack 'fedavg': lr must be > 0")
        check(min(self.tv, self.tv_alternative) >= 0, "attack 'fedavg': tv and tv_alternative must be >= 0")
        check(self.order_prior >= 0, "attack 'fedavg': order_prior must be >= 0")
        check(self.restarts >= 1, "attack 'fedavg': restarts must be >= 1")
        check(self.placed_arrangements >= 0, "attack 'fedavg': placed_arrangements must be >= 0")
        check(self.polish >= 0, "attack 'fedavg': polish must be >= 0")
        check(min(self.label_trial_iterations, self.label_finalists) >= 1,
              "attack 'fedavg': label_trial_iterations and label_finalists must be >= 1")
        # the inverter draws one image per example, not the per-epoch copies this attack optimises
        check(self.init != "learned", "attack 'fedavg': init=learned is not available (use it with ig, cpl, rog or "
                                      "gradinversion)")


@dataclass(frozen=True)
class Layout:
    """Where every local step's examples sit among the candidate rows: `steps` are row
    indices, `example[r]` is the example slot row r stands for (slots are the recovered
    labels' positions), `epoch[r]` its copy number."""

    steps: list[tuple[int, ...]]
    example: list[int]
    epoch: list[int]

    @property
    def copies(self) -> int:
        return max(self.epoch) + 1

    def step_mix(self, labels) -> tuple[tuple[int, ...], ...]:
        """The labels each local step sees (sorted within the step), for `labels` by example slot."""
        return tuple(tuple(sorted(int(labels[self.example[r]]) for r in step)) for step in self.steps)

    @property
    def used(self) -> torch.Tensor:
        """Rows some local step trains on (copies of a partial last epoch may be unused)."""
        used = torch.zeros(len(self.example), dtype=torch.bool)
        used[[r for step in self.steps for r in step]] = True
        return used


def client_layout(obs: Observation, copies: str) -> Layout:
    """The candidate rows and mini-batches that mirror the client's local training."""
    training, samples = obs.training, obs.batch_size
    if training.is_fedsgd or copies == "shared" or (copies == "auto" and training.replayable):
        steps = ([tuple(range(samples))] if training.is_fedsgd else training.step_indices(samples))
        return Layout(steps, list(range(samples)), [0] * samples)
    if training.order != "unknown":
        # the known order, every appearance of an example its own copy
        seen: dict[int, int] = {}
        example: list[int] = []
        epoch: list[int] = []
        steps: list[tuple[int, ...]] = []
        for idx in training.step_indices(samples):
            rows = []
            for i in idx:
                rows.append(len(example))
                example.append(i)
                epoch.append(seen.get(i, 0))
                seen[i] = seen.get(i, 0) + 1
            steps.append(tuple(rows))
        return Layout(steps, example, epoch)
    # the order unknown: the client's mini-batches of every epoch, over the attack's rows
    batch = training.step_batch_size(samples)
    per_epoch = math.ceil(samples / batch)
    total = training.num_steps(samples)
    epochs = math.ceil(total / per_epoch)
    steps = [tuple(e * samples + i for i in range(b * batch, min((b + 1) * batch, samples)))
             for e in range(epochs) for b in range(per_epoch)][:total]
    return Layout(steps, [i for _ in range(epochs) for i in range(samples)],
                  [e for e in range(epochs) for _ in range(samples)])


class LabelCandidate(NamedTuple):
    """Labels by example slot. `placed`: this order is their arrangement over the client's
    mini-batches, kept as it is; otherwise a multiset whose arrangement the attack optimises
    where the steps need one (`arrange_labels`)."""

    labels: torch.Tensor
    placed: bool = False


# batches above this many examples are not enumerated (8! orders to tell apart)
MAX_ENUMERATED_BATCH = 8


def arrangements(labels: torch.Tensor, layout: Layout, limit: int) -> list[torch.Tensor] | None:
    """Every distinct arrangement of the multiset `labels` over the example slots, two being
    distinct when some local step of `layout` sees a different mix of labels; None where there
    are more than `limit`, or the batch is too large to enumerate."""
    if len(labels) > MAX_ENUMERATED_BATCH:
        return None
    distinct: dict[tuple, tuple[int, ...]] = {}
    for order in sorted(set(itertools.permutations(labels.tolist()))):
        mix = layout.step_mix(order)
        if mix not in distinct:
            distinct[mix] = order
            if len(distinct) > limit:
                return None
    return [torch.tensor(order, dtype=torch.long) for order in distinct.values()]


@dataclass
class EpochOrderInvariance(Prior):
    """Dimitrov et al.'s epoch-order-invariant prior: the mean of every epoch's copies
    should agree with the mean over all epochs (mean squared difference)."""

    weight: float = 0.0
    epochs: torch.Tensor | None = None  # row → epoch

    def __call__(self, seen: Seen) -> torch.Tensor | None:
        if self.epochs is None or int(self.epochs.max()) == 0:
            return None
        means = torch.stack([seen.x[self.epochs == e].mean(0) for e in range(int(self.epochs.max()) + 1)])
        return (means - means.mean(0)).pow(2).mean()


def combine_copies(x: torch.Tensor, layout: Layout, row_labels: torch.Tensor, flips: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One reconstruction per example and its label: every epoch's copies registered to the
    first epoch's (Hungarian matching among copies of the same label, each copy optionally
    flipped) and averaged. Rows of the result are the example slots; candidate rows no step
    used are left out."""
    x, row_labels = x.detach(), row_labels.detach().cpu()
    example = torch.tensor(layout.example)
    epoch = torch.tensor(layout.epoch)
    slots = max(layout.example) + 1
    reference = torch.zeros((slots, *x.shape[1:]), dtype=x.dtype)
    labels = torch.full((slots,), -1, dtype=torch.long)
    first = epoch == 0
    reference[example[first]] = x[first]
    labels[example[first]] = row_labels[first]
    total, count = reference.clone(), torch.ones(slots)
    used = layout.used
    for e in range(1, layout.copies):
        rows = ((epoch == e) & used).nonzero().flatten()
        copies = x[rows]
        candidates = [copies, copies.flip(-1)] if flips else [copies]
        costs = torch.stack([torch.cdist(reference.flatten(1), c.flatten(1)).pow(2) for c in candidates])
        best, which = costs.min(0)
        allowed = labels[:, None] == row_labels[rows][None, :]
        best = torch.where(allowed, best, torch.full_like(best, 1e12))
        slot_index, row_index = linear_sum_assignment(best.numpy())
        for s, r in zip(slot_index.tolist(), row_index.tolist()):
            if float(best[s, r]) >= 1e12:
                continue
            total[s] += candidates[int(which[s, r])][r]
            count[s] += 1
    return total / count.view(-1, *[1] * (x.dim() - 1)), labels


class PolishedRung(NamedTuple):
    """A rung of signed Adam and its L-BFGS polish: the rows and distance of the better one."""

    out: Outcome
    rows: torch.Tensor
    distance: float
    polished: dict | None


class FirstRung(NamedTuple):
    """A label candidate's run through its first rung: what the climb needs to go on."""

    candidate: LabelCandidate
    engine: Engine
    layout: Layout
    labels: FixedLabels | ArrangedLabels
    extras: dict
    climb: Iterator[Outcome]
    rung: PolishedRung


class FedAvgAttack(ResumableAttack):
    """Dimitrov et al.'s FedAvg attack: the client's epochs simulated on one reconstruction
    of every example per epoch, tied by the epoch-order-invariant prior."""

    name = "fedavg"
    budgets = {"quick": {"iterations": 1000, "polish": 0.5},
               "thorough": {"iterations": 4000, "restarts": 2, "polish": 0.5}}
    Options = FedAvgOptions
    requires = frozenset({"batch_size", "local_training"})
    uses = frozenset({"labels", "prior_data"})

    def blind_to(self, training: TrainingSpec) -> str | None:
        if training.augment and "crop" in training.augment:
            return ("registers the epochs' copies up to a flip, not the client's random crops "
                    "(it averages shifted copies)")
        return None

    def redundant_for(self, training: TrainingSpec, samples: int) -> str | None:
        if training.is_fedsgd or (training.replayable and training.step_batch_size(samples) >= samples):
            return "every local step sees the whole batch in an order the server knows: this is Inverting Gradients"
        return None

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        opt = self.options
        finalists, trials = self._labels(obs, ctx)
        image = obs.kind.picture_shape(obs.input_shape) is not None
        flips = "flip" in obs.training.augment and "flip" in obs.kind.augmentations
        runs = [self._first_rung(obs, candidate, ctx, opt.tv, image) for candidate in finalists]
        if image and opt.tv_alternative not in (0, opt.tv):  # the closest finalist under the other prior
            closest = min(runs, key=lambda run: run.rung.distance)
            runs.append(self._first_rung(obs, closest.candidate, ctx, opt.tv_alternative, image))
        runs.sort(key=lambda run: run.rung.distance)
        if len(runs) > 1:  # the first rungs, closest first
            trials = (trials or []) + [{**_described(run.candidate), "tv": run.extras["tv"],
                                        "distance": round(run.rung.distance, 7), "iterations": opt.iterations}
                                       for run in runs]
        _, engine, layout, label_candidate, extras, climb, rung = runs[0]
        runs.clear()  # the other runs' engines are not needed past their first rung
        while True:
            out, rows, distance, polished = rung
            inputs, slot_labels = combine_copies(rows.cpu(), layout, label_candidate.hard().cpu(), flips)
            yield Reconstruction(inputs=inputs, labels=slot_labels, iterations=out.iterations,
                                 final_distance=distance, **out.trace_fields(),
                                 extras={"copies": layout.copies, "order": obs.training.order, **extras,
                                         "label_trials": trials, "polish": polished})
            rung = self._rung(engine, next(climb), image)

    def _first_rung(self, obs: Observation, candidate: LabelCandidate, ctx: AttackContext, tv: float,
                    image: bool) -> FirstRung:
        """A label candidate's run under TV weight `tv` through its first rung, polished."""
        engine, layout, label_candidate, extras = self._engine(obs, candidate, ctx, self.options.iterations, tv=tv)
        climb = engine.start().doublings(self.options.iterations)
        return FirstRung(candidate, engine, layout, label_candidate, {**extras, "tv": tv}, climb,
                         self._rung(engine, next(climb), image))

    def _rung(self, engine: Engine, out: Outcome, image: bool) -> PolishedRung:
        """A rung's outcome with its polish (`polish`): the better-matching rows and distance."""
        rows, distance, polished = out.inputs, out.distance, None
        if self.options.polish:
            result = self._polish(engine, out, image)
            polished = {"distance_before": out.distance, "evaluations": result.evaluations}
            if result.distance < distance:
                rows, distance = result.inputs, result.distance
        return PolishedRung(out, rows, distance, polished)

    def _polish(self, engine: Engine, out: Outcome, image: bool) -> Outcome:
        """L-BFGS with a line search on the matching distance alone, from a rung's result with
        its labels fixed (`polish`); the best point it evaluated. The rung's own run is untouched,
        so the next rung resumes from where signed Adam left it."""
        start = out.inputs
        polish = Engine(matching=engine.matching, labels=FixedLabels(out.labels),
                        candidates=lambda r: Pixels(start, box=image),
                        optimizer=Optimizer("lbfgs", 1.0, inner=POLISH_EVALUATIONS, line_search=True,
                                            tolerances=False),
                        iterations=math.ceil(self.options.polish * out.iterations / POLISH_EVALUATIONS),
                        box=image, keep_best=True, model=engine.model, deadline=engine.deadline)
        result = polish.run()
        if not image:
            return result
        # the best point may be one the line search tried, before the step was projected
        inside = result.inputs.clamp(0, 1)
        return dataclasses.replace(result, inputs=inside, distance=polish._distance(Pixels(inside)))

    def _labels(self, obs: Observation, ctx: AttackContext) -> tuple[list[LabelCandidate], list[dict] | None]:
        """The label candidates whose first rungs compete (`label_trials`, `placed_arrangements`):
        the recovered labels alone, or the candidate multisets, each as its distinct arrangements
        where those are placed; narrowed to `label_finalists` by `label_trial_iterations` of
        matching each where more remain (that round's labels and distances returned beside)."""
        opt = self.options
        if opt.label_trials == "off" or obs.knows("labels"):
            multisets = [recover_labels(obs, opt.label_method, ctx.generator(17))]
        else:
            multisets = label_candidates(obs, ctx.generator(17), within_support=opt.label_trials == "auto")
        candidates = [placed for labels in multisets for placed in self._placed(obs, labels)]
        if len(candidates) <= opt.label_finalists:
            return candidates + _optimised_beside(candidates), None
        trials = sorted((self._engine(obs, c, ctx, opt.label_trial_iterations, trial=True)[0].run().distance, i)
                        for i, c in enumerate(candidates))
        first_round = [{**_described(candidates[i]), "distance": round(d, 7), "iterations": opt.label_trial_iterations}
                       for d, i in trials]
        finalists = [candidates[i] for _, i in trials[:opt.label_finalists]]
        return finalists + _optimised_beside(finalists), first_round

    def _placed(self, obs: Observation, labels: torch.Tensor) -> list[LabelCandidate]:
        """`labels` as the candidates it gives: each of its distinct arrangements, placed, where
        the server knows the order and they are few (`placed_arrangements`); else the multiset."""
        opt = self.options
        if opt.arrange_labels != "auto" or not opt.placed_arrangements or opt.replay == "epochs" \
                or obs.training.order == "unknown":
            return [LabelCandidate(labels)]
        layout = client_layout(obs, opt.copies)
        if not _needs_arranging(obs, layout, labels):
            return [LabelCandidate(labels)]
        orders = arrangements(labels, layout, opt.placed_arrangements)
        return [LabelCandidate(labels)] if orders is None else [LabelCandidate(o, placed=True) for o in orders]

    def _engine(self, obs: Observation, candidate: LabelCandidate, ctx: AttackContext, iterations: int,
                trial: bool = False, tv: float | None = None
                ) -> tuple[Engine, Layout, FixedLabels | ArrangedLabels, dict]:
        """The matching run on a label candidate under TV weight `tv` (the option's by default); a
        label trial's (`_labels`) with one restart and no progress reports."""
        opt = self.options
        labels = candidate.labels
        by_epoch, share = self._epoch_replay(obs, labels, ctx)
        if by_epoch:  # one reconstruction per example; every step sees them all
            layout = Layout([tuple(range(obs.batch_size))], list(range(obs.batch_size)), [0] * obs.batch_size)
            sim: UpdateSimulator = EpochReplay(obs, ctx.device)
        else:
            layout = client_layout(obs, opt.copies)
            sim = UpdateSimulator(obs, ctx.device, steps=layout.steps)
        example = torch.tensor(layout.example)
        row_labels = labels[example].to(ctx.device)
        unknown = obs.training.order == "unknown"
        arrange = not by_epoch and not candidate.placed and (opt.arrange_labels == "on" or (
            opt.arrange_labels == "auto" and _needs_arranging(obs, layout, labels)))
        label_candidate = (ArrangedLabels(labels.to(ctx.device), obs.num_classes, example.to(ctx.device),
                                          (torch.tensor(layout.epoch) if unknown
                                           else torch.zeros(len(example), dtype=torch.long)).to(ctx.device),
                                          ctx.generator(23))
                           if arrange else FixedLabels(row_labels))
        shape = (len(layout.example), *obs.input_shape)
        image = obs.kind.picture_shape(obs.input_shape) is not None  # kept in [0, 1] and smooth
        engine = Engine(
            matching=Matching(sim, sim.target, opt.distance, normalise=opt.distance == "l2"),
            labels=label_candidate,
            candidates=lambda r: Pixels(observed_start(opt.init, shape, ctx.generator(r), obs, row_labels.cpu(), ctx)
                                        .to(ctx.device), box=image),
            optimizer=Optimizer(opt.optimizer, opt.lr, schedule=opt.schedule),
            priors=[TotalVariation((opt.tv if tv is None else tv) if image else 0.0),
                    EpochOrderInvariance(opt.order_prior, torch.tensor(layout.epoch, device=ctx.device))],
            iterations=iterations, restarts=1 if trial else opt.restarts, box=image, model=sim.model,
            progress=None if trial else ctx.progress, deadline=ctx.deadline)
        extras = {"labels_arranged": arrange, "labels_placed": candidate.placed,
                  "replay": "epochs" if by_epoch else "steps", "order_share": share}
        return engine, layout, label_candidate, extras

    def _epoch_replay(self, obs: Observation, labels: torch.Tensor, ctx: AttackContext) -> tuple[bool, float | None]:
        """Whether to replay by epoch, and the order's share of the update where "auto" measured it."""
        replay = self.options.replay
        if replay == "epochs":
            check(plain_training(obs.training),
                  "attack 'fedavg': replay=epochs simulates plain SGD on the plain loss without augmentation; "
                  "this client trains otherwise (use replay=steps)")
            return True, None
        if replay == "steps" or not applies(obs.training, obs.batch_size):
            return False, None
        share = order_share(obs, labels, self.options.distance, ctx.generator(29), ctx.device)
        return share <= MAX_ORDER_SHARE, round(share, 4)


def _needs_arranging(obs: Observation, layout: Layout, labels: torch.Tensor) -> bool:
    """Whether which label sits in which mini-batch is the attack's to find: the client's steps
    see different parts of the batch, the labels are not all one class, and the server cannot
    place them itself (they are recovered as counts, or the order is unknown)."""
    steps_differ = len(layout.steps) > 1 and any(len(step) < len(labels) for step in layout.steps)
    return steps_differ and labels.unique().numel() > 1 and (
        obs.training.order == "unknown" or not obs.knows("labels"))


def _optimised_beside(finalists: list[LabelCandidate]) -> list[LabelCandidate]:
    """Where the first finalist is placed, its multiset with the arrangement optimised instead,
    as one more finalist: the soft arrangement finds no mix the placed ones lack, but the soft
    labels give the matching a way around stalls that a placed arrangement cannot take
    (docs/client-training.md)."""
    if not finalists or not finalists[0].placed:
        return []
    return [LabelCandidate(finalists[0].labels.sort().values)]


def _described(candidate: LabelCandidate) -> dict:
    """A label candidate as the result's extras list it."""
    return {"labels": candidate.labels.tolist(), **({"placed": True} if candidate.placed else {})}
