"""Outbound: does the update the client is about to send leak?

The audit attacks the update as the server would (`gradleak.api.audit_update`, honest
server, the client's training declared) and scores every reconstruction against the client's
own examples, re-identifying it among a gallery of the client's other examples. Cheap
analytic attacks run first (the exact-copy conditions: a dense layer on the input,
`fc-analytic`; a two-layer network, `tensor`; for text, DAGER's span test), then the
strongest applicable optimisation attack at a small budget, until one shows a leak or the
time budget is spent. Which label counts the head's bias update shows is logged beside.

The leak decision weighs the verdict's evidence (`gradleak.leakage.Evidence`: copies, the
recognizable rate, the linkage AUC) against the verdict's tolerance
(`gradleak.leakage.Tolerance`), in `judge_update`; `update_leaks(scores, tolerance)` is it
for one attack's per-example scores. One client-round has a few examples, too few to bound a
rate the way a verdict of "holds" does, so the guard decides by the point estimates, and says
whether chance could explain them (docs/guard.md, "The leak rule"):

- **leaks** when any example is copied exactly, or the recognizable rate or the linkage AUC,
  as measured, is above the tolerance: such an update is never sent as it is;
- **beyond chance** when, besides, the excess is not what a reconstruction that carries nothing
  gives (the verdict's tests: the binomial tail against the re-identification chance, the linkage
  AUC against 0.5 with the null's variance, Holm-corrected over the audit's attacks, at the
  tolerance's level). Only a leak beyond chance withholds the update at the ladder's top rung.
"""
from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from ..api.inputs import GivenGallery
from ..data import Dataset
from ..errors import GradleakError
from ..fl import TrainingSpec
from ..fl.update import Update
from ..leakage import NULL_LINKAGE_VARIANCE, Evidence, Tolerance, holm, parse_tolerance

# The exact-copy attacks, in the order they run (each is closed-form and takes well under
# a second where it applies).
ANALYTIC = ("fc-analytic", "tensor", "dager")


def update_evidence(scores: Sequence[dict]) -> Evidence:
    """The evidence of one attack's per-example scores: copies (`success`), and over the examples
    judged against a gallery (`gallery_rank`, `linkage`), the recognizable count and the linkage
    AUCs, with the re-identification chance."""
    judged = [s for s in scores if s.get("gallery_rank") is not None and s.get("linkage") is not None]
    links = [float(s["linkage"]) for s in judged]
    null = sum(float(s["linkage_null_var"]) if s.get("linkage_null_var") is not None else NULL_LINKAGE_VARIANCE
               for s in judged)
    return Evidence(examples=len(judged), copies=sum(bool(s.get("success")) for s in scores),
                    copies_of=len(scores), recognizable=sum(bool(s.get("recognizable")) for s in judged),
                    linkage_sum=sum(links), linkage_sq=sum(v * v for v in links),
                    chance=max((float(s.get("reid_chance") or 0.0) for s in judged), default=0.0),
                    linkage_null=null if judged else None)


@dataclass(frozen=True)
class UpdateGrade:
    """What one audit's evidence says about an update against the tolerance."""

    leaks: bool  # a copy, or a measured rate above the tolerance: not to be sent as it is
    beyond_chance: bool  # that leak is more than chance explains (at the tolerance's level)
    grade: str  # "copies", "recognizable", "linkable" or "within tolerance"
    reason: str
    attack: str | None = None  # the attack the grade rests on
    # the grade holds at the tolerance's level, not only by the point estimates: a copy, a rate
    # whose interval lies above the tolerance (Evidence.exceeds), or, within tolerance, every
    # attack's rates bounded within it (Evidence.meets). Another run of the audit is then
    # expected to grade the update the same; near the tolerance it may not (docs/guard.md)
    decisive: bool = False


def judge_update(evidence: Sequence[tuple[str, Evidence]], tolerance: Tolerance | str | None = None) -> UpdateGrade:
    """The guard's grade of an update from its attacks' evidence (`(attack, Evidence)` pairs):
    copies first, then the recognizable rate, then the linkage AUC; a measure counts when its
    point estimate is above the tolerance, and is beyond chance when its test, Holm-corrected
    over every attack × both tests as the verdict corrects them, is significant at the
    tolerance's level."""
    tolerance = tolerance if isinstance(tolerance, Tolerance) else parse_tolerance(tolerance)
    alpha = 1 - tolerance.level
    judged = [(a, e) for a, e in evidence if e.examples]
    tests = [(a, kind, p) for a, e in judged for kind, p in (("recognizable", e.recognizable_p()),
                                                             ("linkage", e.linkage_p()))]
    adjusted = {(a, kind): q for (a, kind, _), q in zip(tests, holm([p for _, _, p in tests]))}
    copied = [(a, e) for a, e in evidence if e.copies]
    if copied:
        attack, e = max(copied, key=lambda ae: ae[1].copies / max(ae[1].copies_of, 1))
        return UpdateGrade(True, True, "copies", f"{attack}: {e.copies} of {e.copies_of} examples copied "
                           "exactly (a copy is no chance event)", attack, decisive=True)
    for kind, limit, value, text in (
            ("recognizable", tolerance.recognizable, lambda e: e.recognizable_rate,
             lambda e: f"{e.recognizable} of {e.examples} examples recognizable ({100 * e.recognizable_rate:.3g}%, "
                       f"re-identification chance {100 * e.chance:.2g}%)"),
            ("linkage", tolerance.linkage, lambda e: e.linkage,
             lambda e: f"linkage AUC {e.linkage:.3f} over {e.examples} examples")):
        above = [(a, e) for a, e in judged if value(e) > limit]
        if not above:
            continue
        attack, e = min(above, key=lambda ae: adjusted[(ae[0], kind)])
        q = adjusted[(attack, kind)]
        beyond = q <= alpha
        chance = (f"beyond chance (Holm-corrected p {q:.2g})" if beyond else
                  f"within chance (Holm-corrected p {q:.2g} > {alpha:.2g})")
        grade = "recognizable" if kind == "recognizable" else "linkable"
        bound = f"{100 * limit:g}%" if kind == "recognizable" else f"{limit:g}"
        return UpdateGrade(True, beyond, grade, f"{attack}: {text(e)}, above the tolerance's {bound}, {chance}",
                           attack, decisive=any(e.exceeds(tolerance) for _, e in above))
    if not evidence:
        return UpdateGrade(False, False, "within tolerance", "no example scored")
    attack, e = max(evidence, key=lambda ae: (ae[1].linkage or 0.0, ae[1].recognizable_rate or 0.0))
    if not e.examples:
        return UpdateGrade(False, False, "within tolerance", f"{attack}: no copy among {e.copies_of} examples "
                           "(no gallery: only copies can show a leak)", attack)
    bounded = all(e.meets(tolerance) for _, e in evidence)
    return UpdateGrade(False, False, "within tolerance",
                       f"{attack}: no copy, {e.recognizable} of {e.examples} recognizable, linkage AUC "
                       f"{e.linkage:.3f}: within the tolerance ({tolerance.describe()}, "
                       + ("bounded at its level)" if bounded else "by the point estimates)"),
                       attack, decisive=bounded)


def update_leaks(scores: Sequence[dict], tolerance: Tolerance | str | None = None) -> tuple[bool, str]:
    """Whether one attack's per-example scores show the update leaking beyond `tolerance` (see
    `judge_update`), and why, in one line."""
    if not scores:
        return False, "no example scored"
    grade = judge_update([("attack", update_evidence(scores))], tolerance)
    return grade.leaks, grade.reason.removeprefix("attack: ")


@dataclass
class OutboundAudit:
    """The audit of one update: whether it leaks (and whether beyond chance), which attack
    showed it, what each attack scored and how long it took."""

    leaks: bool
    reason: str
    attack: str | None = None  # the attack the grade rests on (or the last one run)
    beyond_chance: bool = False
    verdict: str = "within tolerance"  # "copies", "recognizable", "linkable" or "within tolerance"
    attacks_run: list[dict] = field(default_factory=list)  # attack, seconds, the evidence's numbers
    skipped: list[str] = field(default_factory=list)  # attacks not run and why, one line each
    labels_shown: dict | None = None
    seconds: float = 0.0
    budget_spent: bool = False
    decisive: bool = False  # the grade holds at the tolerance's level (UpdateGrade.decisive)

    @property
    def grade(self) -> str:
        return "leaks" if self.leaks else "within tolerance"

    def to_dict(self) -> dict:
        return {"leaks": self.leaks, "grade": self.grade, "verdict": self.verdict,
                "beyond_chance": self.beyond_chance, "reason": self.reason, "attack": self.attack,
                "attacks_run": self.attacks_run, "skipped": self.skipped, "labels_shown": self.labels_shown,
                "seconds": round(self.seconds, 3), "budget_spent": self.budget_spent, "decisive": self.decisive}


@dataclass
class OutboundCase:
    """What the audits of one round's update share, whatever rung each checks: the client's
    examples as a dataset (wrapped once) and the attacks to run on them (`orders`: the honest
    server's expected view and the selection, made once per sample and client count of the
    update; every audit of one case attacks the same model, trained the same way, with the same
    attacks)."""

    inputs: torch.Tensor
    labels: torch.Tensor
    num_classes: int | None = None
    tokenizer: str | None = None
    data: Dataset | None = field(default=None, init=False, repr=False)
    orders: dict = field(default_factory=dict, init=False, repr=False)

    def dataset(self) -> Dataset:
        if self.data is None:
            from ..data.tensors import dataset_from_tensors

            self.data = dataset_from_tensors(self.inputs, self.labels, name="guard", num_classes=self.num_classes,
                                             tokenizer=self.tokenizer)
        return self.data


@dataclass(frozen=True)
class LadderCheck:
    """One rung the ladder walk may check: its index (0: the update as it is; k: the k-th rung
    of the ladder) and the defenses it applies, named to the audit (what its threat model may
    know)."""

    rung: int
    defenses: tuple[str, ...] = ()


@dataclass
class LadderAudit:
    """The walk of a ladder (`audit_ladder`): per rung checked, in order, its audit, the update
    it would send and the client's defense memory after it; `passed`: the position (in those
    lists) of the first rung whose update does not leak, None when every rung checked leaks."""

    audits: list[OutboundAudit] = field(default_factory=list)
    candidates: list[Update] = field(default_factory=list)
    states: list[dict] = field(default_factory=list)
    passed: int | None = None


def audit_outbound(model_before: nn.Module, update: Update, inputs: torch.Tensor, labels: torch.Tensor, *,
                   training: TrainingSpec, tolerance: Tolerance | str | None = None, attacks="auto",
                   strongest: Sequence[str] = ("ig:iterations=300",), gallery: GivenGallery | None = None,
                   defenses: Sequence[str] = (), budget: str = "quick", time_budget: float = 60.0,
                   num_classes: int | None = None, tokenizer: str | None = None, seed: int = 0,
                   case: OutboundCase | None = None) -> OutboundAudit:
    """Attack `update` (computed from `model_before` on `inputs`, `labels`) and decide: after
    each attack, `judge_update` on the evidence of every attack so far; the first leak stops.
    `defenses`: what the client applied to it. `case`: what the audits of the same round's
    update share; None: this audit's own. (A ladder of one rung, the update as it is.)"""
    return audit_ladder(model_before, update, inputs, labels, training=training,
                        checks=[LadderCheck(0, tuple(defenses))], tolerance=tolerance, attacks=attacks,
                        strongest=strongest, gallery=gallery, budget=budget, time_budget=time_budget,
                        num_classes=num_classes, tokenizer=tokenizer, seed=seed, case=case).audits[0]


def audit_ladder(model_before: nn.Module, update: Update, inputs: torch.Tensor, labels: torch.Tensor, *,
                 training: TrainingSpec, checks: Sequence[LadderCheck],
                 defend: Callable[[int, dict], Update] | None = None, client_state: dict | None = None,
                 tolerance: Tolerance | str | None = None, attacks="auto",
                 strongest: Sequence[str] = ("ig:iterations=300",), gallery: GivenGallery | None = None,
                 budget: str = "quick", time_budget: float = 60.0, num_classes: int | None = None,
                 tokenizer: str | None = None, seed: int = 0, case: OutboundCase | None = None) -> LadderAudit:
    """Check the rungs of `checks` in order until the first whose update does not leak (the
    guard's walk up its ladder, one call per round): each rung's update is `defend(rung, state)`
    (`update` itself without `defend`), `state` a copy of `client_state` that the rung's defense
    may change; it is attacked as `audit_outbound` describes (after each attack, `judge_update`
    on the evidence of every attack so far; the first leak stops; `time_budget` seconds per
    rung, counted from the rung's update). The examples are wrapped, and the attacks chosen, once
    for all the rungs (`case`, shared with the caller's other audits of this update; None: the
    walk's own); the layers below are called from here alone, so that the walk goes down once
    per rung rather than back through the guard."""
    from ..api import audit_update
    from ..models import labels_shown

    tolerance = tolerance if isinstance(tolerance, Tolerance) else parse_tolerance(tolerance)
    case = case if case is not None else OutboundCase(inputs, labels, num_classes, tokenizer)
    walked = LadderAudit()
    for check in checks:
        # a defense with memory (DGC's residuals) keeps only the chosen rung's
        state = copy.deepcopy(client_state) if client_state is not None else {}
        candidate = defend(check.rung, state) if defend is not None else update
        start = time.perf_counter()
        key = (candidate.samples, candidate.clients)
        if key not in case.orders:
            case.orders[key] = attack_order(attacks, strongest, model_before, case, training, candidate)
        chosen, passed_over = case.orders[key]
        data = case.dataset()
        result = OutboundAudit(False, "no applicable attack",
                               labels_shown=labels_shown(model_before, candidate.tensors, labels))
        result.skipped = [f"{s.attack}: {s.reason}" for s in passed_over]
        evidence: list[tuple[str, Evidence]] = []
        for text in chosen:
            if time.perf_counter() - start > time_budget:
                result.budget_spent = True
                result.reason = (f"time budget of {time_budget:g} s spent before {text}; "
                                 + (result.reason if result.attacks_run else "no attack ran"))
                break
            attack_start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                audit = audit_update(model_before, candidate, data.inputs, data.labels, training=training,
                                     attacks=[text], defenses=check.defenses, num_classes=data.num_classes,
                                     seed=seed, budget=budget, lpips="none", gallery=gallery,
                                     tokenizer=tokenizer, data_label="guard",
                                     time_budget=max(0.0, time_budget - (time.perf_counter() - start)))
            result.skipped += [f"{s.attack}: {s.reason}" for s in audit.skipped]
            for run in audit.runs:
                found = update_evidence(run.per_example)
                evidence.append((text, found))
                result.attacks_run.append({"attack": text, "seconds": round(time.perf_counter() - attack_start, 3),
                                           "examples": found.copies_of, "copies": found.copies,
                                           "recognizable": found.recognizable, "judged": found.examples,
                                           "linkage": None if found.linkage is None else round(found.linkage, 4)})
            cut = any(run.extras.get("ladder", {}).get("decision") == "out of time" for run in audit.runs)
            if evidence:
                grade = judge_update(evidence, tolerance)
                result.leaks, result.beyond_chance, result.verdict = grade.leaks, grade.beyond_chance, grade.grade
                result.decisive = grade.decisive
                result.attack, result.reason = grade.attack or text, grade.reason
            if cut:
                result.budget_spent = True
                if not result.leaks:
                    result.reason = (f"time budget of {time_budget:g} s spent inside {text} (stopped where it was); "
                                     + result.reason)
            if result.leaks:
                break
        result.seconds = time.perf_counter() - start
        walked.audits.append(result)
        walked.candidates.append(candidate)
        walked.states.append(state)
        if not result.leaks:
            walked.passed = len(walked.audits) - 1
            break
    return walked


def attack_order(attacks, strongest: Sequence[str], model: nn.Module, case: OutboundCase, training: TrainingSpec,
                 update: Update):
    """The attacks to run on `case`'s examples, cheapest first, and the skipped ones: "auto" is
    the analytic attacks that apply, then the first of `strongest` that applies."""
    from ..api import select_attacks
    from ..threat import expected_view, make_threat_model

    view = expected_view(make_threat_model("honest", ()), training, update.samples, update.clients)
    data = case.dataset()
    if not (isinstance(attacks, str) and attacks.strip().lower() == "auto"):
        listed = [attacks] if isinstance(attacks, str) else list(attacks)
        return select_attacks(listed, model, data.input_shape, data.num_classes, data.modality, view,
                              "quick", training, update.samples)
    chosen, skipped = select_attacks(list(ANALYTIC), model, data.input_shape, data.num_classes, data.modality,
                                     view, "quick", training, update.samples)
    for text in strongest:
        picked, passed = select_attacks([text], model, data.input_shape, data.num_classes, data.modality, view,
                                        "quick", training, update.samples)
        skipped += passed
        if picked:
            chosen += picked
            break
    if not chosen:
        raise GradleakError("guard: no attack applies to this update (model, data and training); the guard "
                            "cannot check it (give `attacks` explicitly)")
    return chosen, skipped
