"""A client-side guard: refuse a model crafted to leak, never send an update the audit says leaks.

Two halves, for any framework (the Flower client mod is `gradleak.flower.guard`):

- inbound (`check_received`, `Guard.inbound`): before training, the received model is
  checked for the signs of a crafted one (`gradleak.guard.inbound`);
- outbound (`guard`, `Guard.outbound`): after training, every round, the update is checked
  for pairs of a dense layer's rows whose difference is one of the client's examples (a binning
  imprint, also one disguised to pass the inbound checks: `gradleak.guard.bins`), and withheld
  if it has one; then the update is attacked as the server would attack it and scored against
  the client's own examples (`gradleak.guard.outbound`); while it leaks beyond the verdict's tolerance (by the measured
  rates), the next rung of the defense ladder is applied and the update re-checked; if the
  top rung still leaks beyond what chance explains, the update is withheld.

Every decision is one JSON line in the log (round, stage, grade, rung, seconds, reason).
See docs/guard.md.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from ..api.inputs import GivenGallery
from ..errors import GradleakError
from ..fl import TrainingSpec
from ..fl.update import Update
from ..seeding import stream
from .bins import binned_pairs
from .config import DEFAULT_LADDER, GuardConfig, Rung, parse_ladder
from .inbound import Finding, InboundReport, inspect_received, state_of
from .outbound import (
    LadderAudit,
    LadderCheck,
    OutboundAudit,
    OutboundCase,
    UpdateGrade,
    audit_ladder,
    audit_outbound,
    judge_update,
    update_evidence,
    update_leaks,
)

__all__ = ["guard", "Guard", "GuardConfig", "GuardDecision", "check_received", "InboundReport", "Finding",
           "OutboundAudit", "OutboundCase", "LadderAudit", "LadderCheck", "audit_ladder", "audit_outbound",
           "UpdateGrade", "judge_update", "update_evidence", "update_leaks", "parse_ladder", "DEFAULT_LADDER",
           "model_drift"]


@dataclass
class GuardDecision:
    """What the guard decided for one outgoing update."""

    send: bool
    update: Update | None  # what to send (None: withhold)
    rung: int  # 0: no defense; k: the k-th rung of the ladder
    rung_text: str
    # "within tolerance", "within chance" (the top rung, above the tolerance by chance-level
    # evidence only), "withheld", "crafted", "not audited"
    grade: str
    reason: str
    seconds: float
    audits: list[OutboundAudit] = field(default_factory=list)  # one per rung checked

    def to_dict(self) -> dict:
        return {"send": self.send, "rung": self.rung, "rung_text": self.rung_text, "grade": self.grade,
                "reason": self.reason, "seconds": round(self.seconds, 3),
                "audits": [a.to_dict() for a in self.audits]}


def check_received(received: nn.Module | dict, previous: nn.Module | dict | None = None,
                   own_change: dict | None = None) -> InboundReport:
    """Before training: is `received` crafted to leak? (see `gradleak.guard.inbound`)"""
    return inspect_received(received, previous, own_change)


def guard(model_before: nn.Module, update: Update, examples: tuple[torch.Tensor, torch.Tensor], *,
          training: TrainingSpec, config: GuardConfig | None = None, gallery: GivenGallery | None = None,
          previous: nn.Module | dict | None = None, num_classes: int | None = None,
          tokenizer: str | None = None, server_round: int = 1) -> GuardDecision:
    """The plain-PyTorch guard for one round: `model_before` is the model the client received
    and trained from, `update` what it would send (`gradleak.fl.Update`; `model_before`
    minus the trained weights for FedAvg), `examples` the `(inputs, labels)` it trained on,
    `training` how it trained (needed to retrain under a rung that acts during training, and
    to attack as a server that knows the protocol), `gallery` other examples of the client's.
    With `previous` (the model received the round before), the received model is checked
    first and a crafted one is never answered. Returns the decision; `decision.update` is
    what to send, None to withhold."""
    g = Guard(config or GuardConfig(), training=training, num_classes=num_classes, tokenizer=tokenizer)
    if previous is not None:
        g.previous = state_of(previous)
        report = g.inbound(model_before, server_round)
        if report.crafted:
            return GuardDecision(False, None, 0, "", "crafted", report.summary(), report.seconds)
    return g.outbound(model_before, update, examples, gallery=gallery, server_round=server_round)


class Guard:
    """The guard of one client across rounds: it remembers the last model that passed the
    inbound checks, the client's own last update and the rung chosen at the last audit.

    `state`: that memory as a plain dict (`state_dict()`, keys `previous`, `own_change`, `rung`,
    `withholding`, `decisive`, `audited_model`, `audited_norm`, `audited_examples`), for a
    framework that keeps it between rounds and builds a Guard per round (the Flower mod keeps it
    in the node's `context.state`).

    Between the audits of every k-th round (`GuardConfig.every`) a round is screened at the
    cost of two norms: it is audited anyway when nothing was audited yet, when the update's norm
    grew past `GuardConfig.growth` times the last audited one under a rung that adds a defense
    (the update as trained has no noise for its signal to outgrow), when it trained on fewer examples,
    or, unless the last audit's decision was decisive (each rung's grade held at the tolerance's
    level, not only by its point estimates), when the received model moved by more than
    `GuardConfig.drift` of its norm since the last audited round (docs/guard.md, "Between
    audits")."""

    def __init__(self, config: GuardConfig, training: TrainingSpec | None = None, num_classes: int | None = None,
                 tokenizer: str | None = None, client: Any = None, state: Mapping[str, Any] | None = None):
        self.config = config
        self.training = training
        self.num_classes, self.tokenizer, self.client = num_classes, tokenizer, client
        needs_training = [r.text for r in config.rungs if r.acts_in_training]
        if needs_training and training is None:
            raise GradleakError(f"guard: ladder rung '{needs_training[0]}' acts during training; give the guard "
                                "the client's training (a TrainingSpec) so that it can retrain under it")
        self.previous: dict[str, torch.Tensor] | None = None
        self.own_change: dict[str, torch.Tensor] | None = None
        self.rung = 0  # the rung chosen at the last audit
        self.withholding = False  # the last audit withheld the update: so do the rounds until the next
        # the last audit's decision rests on grades that hold at the tolerance's level (each rung
        # checked below the chosen one leaked beyond its interval, the chosen one was bounded
        # within it): another audit of a similar update is expected to decide the same
        self.decisive = False
        # the last audited round's model, update norm and example count: the screen between audits
        # compares with them
        self.audited_model: dict[str, torch.Tensor] | None = None
        self.audited_norm: float | None = None
        self.audited_examples: int | None = None
        self.client_state: dict = {}
        if state is not None:
            self.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        """The guard's memory across rounds as a plain dict: `previous` (the last model that
        passed, a state dict, or None), `own_change` (the tensors of the client's last sent
        update, or None), `rung` (chosen at the last audit), `withholding`, and the last audited
        round's model (`audited_model`, a state dict; kept only with `every` > 1 and `drift` on),
        update norm (`audited_norm`) and example count (`audited_examples`), None before the
        first audit."""
        return {"previous": self.previous, "own_change": self.own_change, "rung": self.rung,
                "withholding": self.withholding, "decisive": self.decisive, "audited_model": self.audited_model,
                "audited_norm": self.audited_norm, "audited_examples": self.audited_examples}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the memory a `state_dict()` gave (missing keys keep their start values)."""
        self.previous = state.get("previous", self.previous)
        self.own_change = state.get("own_change", self.own_change)
        self.rung = int(state.get("rung", self.rung))
        self.withholding = bool(state.get("withholding", self.withholding))
        self.decisive = bool(state.get("decisive", self.decisive))
        self.audited_model = state.get("audited_model", self.audited_model)
        norm, examples = state.get("audited_norm", self.audited_norm), state.get("audited_examples",
                                                                                  self.audited_examples)
        self.audited_norm = None if norm is None else float(norm)
        self.audited_examples = None if examples is None else int(examples)

    # ------------------------------------------------------------------ inbound

    def inbound(self, received, server_round: int) -> InboundReport:
        """Check the received model; remember it as the reference when it passes."""
        state = state_of(received)
        report = inspect_received(state, self.previous, self.own_change)
        self.log({"round": server_round, "stage": "inbound", "grade": "crafted" if report.crafted else "clean",
                  "reason": report.summary(), "checks": report.checks, "seconds": round(report.seconds, 4),
                  "compared_with_previous": report.compared_with_previous})
        if not report.crafted:
            self.previous = state
        return report

    # ------------------------------------------------------------------ outbound

    def audited_round(self, server_round: int) -> bool:
        """Whether `server_round` is one of the scheduled audits (every k-th round)."""
        return (server_round - 1) % self.config.every == 0

    def audit_due(self, server_round: int, model: nn.Module, update_norm: float, examples: int) -> str | None:
        """Why this round's update (of norm `update_norm`, trained on `examples`) is audited
        ("scheduled", "first", "model moved 7.2%", "grew ×1.43", "fewer examples"), or None: the
        screen found nothing the last audit had not seen."""
        if self.audited_round(server_round):
            return "scheduled"
        if self.audited_norm is None or self.audited_examples is None:
            return "first"  # a client that joins between scheduled rounds has no audit to go by
        if examples < self.audited_examples:
            return "fewer examples"
        if self.config.drift and not self.decisive:
            if self.audited_model is None:
                return "first"
            moved = model_drift(self.audited_model, state_of(model))
            if moved > self.config.drift:
                return f"model moved {100 * moved:.1f}%"
        ratio = update_norm / max(self.audited_norm, 1e-30)
        # growth is signal over the rung's noise; an update sent as trained has none, and the
        # attacks match its direction (cosine), not its scale
        if self.config.growth and self.rung > 0 and ratio > self.config.growth:
            return f"grew ×{ratio:.2f}"
        return None

    def outbound(self, model_before: nn.Module, update: Update, examples: tuple[torch.Tensor, torch.Tensor], *,
                 gallery: GivenGallery | None = None, server_round: int = 1,
                 training: TrainingSpec | None = None) -> GuardDecision:
        """Audit `update`; climb the ladder while it leaks; withhold it if the top rung leaks."""
        start = time.perf_counter()
        training = training or self.training
        if training is None:
            raise GradleakError("guard: the outbound audit needs the client's training (a TrainingSpec)")
        x, y = examples
        cfg = self.config
        audits: list[OutboundAudit] = []
        norm = float(update.flat().detach().double().norm())
        binned = binned_pairs(model_before, update, x)
        # a binned update is withheld unaudited: the screen's model comparison is not needed then
        due = None if binned else self.audit_due(server_round, model_before, norm, len(x))
        screened = f"round not audited (every {cfg.every}{self._screen_text()})"
        if binned:
            # a binning imprint the inbound checks did not see: no rung of noise is the answer
            shown = "; ".join(str(p) for p in binned[:2]) + (f" (+{len(binned) - 2} more)" if len(binned) > 2 else "")
            decision = GuardDecision(False, None, self.rung, self._rung_text(self.rung), "crafted",
                                     f"the model bins this client's examples: {len(binned)} of {len(x)} read from "
                                     f"pairs of rows ({shown}); update withheld", time.perf_counter() - start)
        elif due is None and self.withholding:
            decision = GuardDecision(False, None, self.rung, self._rung_text(self.rung), "withheld",
                                     f"{screened}; the last audit withheld the top rung", time.perf_counter() - start)
        elif due is None:
            sent = self.defended(self.rung, model_before, update, x, y, training, server_round, self.client_state)
            decision = GuardDecision(True, sent, self.rung, self._rung_text(self.rung), "not audited",
                                     f"{screened}; the last chosen rung applied", time.perf_counter() - start)
        else:
            # the model is kept only where a screen between audits may compare with it
            self.audited_model = state_of(model_before) if cfg.every > 1 and cfg.drift else None
            self.audited_norm, self.audited_examples = norm, len(x)
            first = self.rung if cfg.start == "last" else 0
            # the whole ladder to one walk below (audit_ladder): the rungs in order until the first
            # whose update does not leak, the examples wrapped and the attacks chosen once
            ladder = audit_ladder(
                model_before, update, x, y, training=training,
                checks=[LadderCheck(rung, self._rung_defenses(rung)) for rung in range(first, len(cfg.rungs) + 1)],
                defend=lambda rung, state: self.defended(rung, model_before, update, x, y, training, server_round,
                                                         state),
                client_state=self.client_state, tolerance=cfg.tolerance, attacks=cfg.attacks,
                strongest=cfg.strongest, gallery=gallery, budget=cfg.budget, time_budget=cfg.time_budget,
                num_classes=self.num_classes, tokenizer=self.tokenizer, seed=cfg.seed,
                case=OutboundCase(x, y, num_classes=self.num_classes, tokenizer=self.tokenizer))
            audits = ladder.audits
            decision = None
            if ladder.passed is not None:
                rung, audit = first + ladder.passed, audits[ladder.passed]
                self.rung, self.client_state = rung, ladder.states[ladder.passed]
                decision = GuardDecision(True, ladder.candidates[ladder.passed], rung, self._rung_text(rung),
                                         audit.grade, audit.reason, time.perf_counter() - start, audits)
            elif not audits[-1].beyond_chance:
                # above the tolerance as measured, but no more than chance gives: withholding would
                # refuse a well-defended update on chance; the strongest rung goes out
                self.rung, self.client_state = len(cfg.rungs), ladder.states[-1]
                decision = GuardDecision(True, ladder.candidates[-1], self.rung, self._rung_text(self.rung),
                                         "within chance", f"the top rung is above the tolerance only within chance "
                                         f"({audits[-1].reason}); sent under it", time.perf_counter() - start, audits)
            self.withholding = decision is None
            # decisive: every rung checked below the last leaked beyond its interval, and the last
            # was bounded within the tolerance (sent) or beyond it (withheld); "within chance" is not
            self.decisive = all(a.decisive for a in audits) and (decision is None or decision.grade != "within chance")
            if decision is None:
                self.rung = len(cfg.rungs)
                decision = GuardDecision(False, None, self.rung, self._rung_text(self.rung), "withheld",
                                         f"the top rung still leaks ({audits[-1].reason}); update withheld",
                                         time.perf_counter() - start, audits)
        if decision.send and decision.update is not None:
            self.own_change = dict(decision.update.tensors)
        self.log({"round": server_round, "stage": "outbound", "audit": due, "grade": decision.grade,
                  "rung": decision.rung,
                  "rung_text": decision.rung_text, "sent": decision.send, "reason": decision.reason,
                  "seconds": round(decision.seconds, 3),
                  "audits": [{"rung": decision.rung - len(audits) + 1 + k, "leaks": a.leaks, "verdict": a.verdict,
                              "beyond_chance": a.beyond_chance, "decisive": a.decisive, "attacks": a.attacks_run,
                              "seconds": round(a.seconds, 3), "budget_spent": a.budget_spent}
                             for k, a in enumerate(audits)],
                  "labels_shown": audits[0].labels_shown if audits else None})
        return decision

    def defended(self, rung: int, model_before: nn.Module, update: Update, x: torch.Tensor, y: torch.Tensor,
                 training: TrainingSpec, server_round: int, state: dict | None = None) -> Update:
        """`update` under rung `rung` (0: as it is), by the one application of a defense chain
        to a trained update (`DefenseChain.defend`: an update-place chain transforms it; a
        chain that acts during training retrains the client under it). `state`: the client's
        defense memory across rounds (default: the guard's)."""
        state = self.client_state if state is None else state
        if rung == 0:
            return update
        step: Rung = self.config.rungs[rung - 1]
        generator = stream(self.config.seed, "guard", str(self.client), server_round, rung)
        # a fresh chain per application: a defense may count what it did (fedcdp's tensors_clipped)
        return step.chain().defend(update, model_before, x, y, training, generator, state)

    def log(self, record: dict) -> None:
        if self.client is not None:
            record = {"client": self.client, **record}
        if self.config.log:
            path = Path(self.config.log)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(json.dumps(record, default=str) + "\n")

    def _screen_text(self) -> str:
        drift = self.config.drift and not self.decisive
        tests = ([f"the model moved less than {self.config.drift:g} of its norm"] if drift else []) + \
            ([f"the update grew less than ×{self.config.growth:g}"] if self.config.growth and self.rung else [])
        decisive = "; the last audit decided at the tolerance's level" if self.decisive else ""
        return decisive + (f"; since the last audit {' and '.join(tests)}" if tests else "")

    def _rung_text(self, rung: int) -> str:
        return self.config.rungs[rung - 1].text if rung else "none"

    def _rung_defenses(self, rung: int) -> tuple[str, ...]:
        return tuple(str(s) for s in self.config.rungs[rung - 1].specs) if rung else ()


def model_drift(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]) -> float:
    """How far `after` moved from `before`: the norm of the change over the norm of `before`,
    over their shared floating-point tensors (a tensor whose shape changed counts as moved
    entirely)."""
    change = total = 0.0
    for name, old in before.items():
        if name not in after or not old.is_floating_point():
            continue
        new = after[name]
        old64 = old.double()
        total += float(old64.pow(2).sum())
        change += float((new.double() - old64).pow(2).sum()) if new.shape == old.shape else float(
            old64.pow(2).sum() + new.double().pow(2).sum())
    return math.sqrt(change / max(total, 1e-30))
