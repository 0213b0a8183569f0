"""Outbound: does the update the client is about to send leak?

The audit attacks the update as the server would (`gradleak.api.audit_update`, honest
server, the client's training declared) and scores every reconstruction against the client's
own examples, re-identifying it among a gallery of the client's other examples. Cheap
analytic attacks run first (the exact-copy conditions: a dense layer on the input,
`fc-analytic`; a two-layer network, `tensor`; for text, DAGER's span test), then the
strongest applicable optimisation attack at a small budget, until one shows a leak or the
time budget is spent. Which label counts the head's bias update shows is logged beside.

The leak decision is one function, `update_leaks(scores, tolerance)`.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from ..errors import GradleakError
from ..fl import TrainingSpec
from ..fl.update import Update
from ..stats import above_chance

# The exact-copy attacks, in the order they run (each is closed-form and takes well under
# a second where it applies).
ANALYTIC = ("fc-analytic", "tensor", "dager")


def update_leaks(scores: Sequence[dict], tolerance: float) -> tuple[bool, str]:
    """Whether per-example scores of one attack expose more than `tolerance` of the examples,
    and why, in one line. An example is exposed when its reconstruction is an exact copy
    (`success`) or, where the scorer gives one, `recognizable`; re-identifications among the
    gallery (`gallery_rank` 0) count too when there are more of them than chance explains
    (`reid_chance`: the exact binomial interval's lower end above it, as the verdicts judge)."""
    if not scores:
        return False, "no example scored"
    exposed, copied, identified, beyond_chance = _exposure(scores)
    what = (f"{exposed} of {len(scores)} examples exposed ({copied} copied exactly, "
            f"{identified} re-identified{'' if beyond_chance else ', within chance'})")
    if exposed / len(scores) > tolerance:
        return True, f"{what}: above the tolerance of {tolerance:.0%}"
    return False, f"{what}: within the tolerance of {tolerance:.0%}"


def _exposure(scores: Sequence[dict]) -> tuple[int, int, int, bool]:
    """(exposed, copied, re-identified, whether the re-identifications exceed chance)."""
    copied = [bool(s.get("success")) for s in scores]
    identified = [s.get("gallery_rank") == 0 for s in scores]
    chance = max((s.get("reid_chance") or 0.0 for s in scores), default=0.0)
    beyond_chance = chance == 0 or above_chance(sum(identified), len(scores), chance)
    exposed = sum(bool(c or s.get("recognizable") or (i and beyond_chance))
                  for c, i, s in zip(copied, identified, scores))
    return exposed, sum(copied), sum(identified), beyond_chance


@dataclass
class OutboundAudit:
    """The audit of one update: whether it leaks, which attack showed it, what each attack
    scored and how long it took."""

    leaks: bool
    reason: str
    attack: str | None = None  # the attack that showed the leak (or the last one run)
    attacks_run: list[dict] = field(default_factory=list)  # attack, seconds, exposed, examples
    skipped: list[str] = field(default_factory=list)  # attacks not run and why, one line each
    labels_shown: dict | None = None
    seconds: float = 0.0
    budget_spent: bool = False

    @property
    def grade(self) -> str:
        return "leaks" if self.leaks else "within tolerance"

    def to_dict(self) -> dict:
        return {"leaks": self.leaks, "grade": self.grade, "reason": self.reason, "attack": self.attack,
                "attacks_run": self.attacks_run, "skipped": self.skipped, "labels_shown": self.labels_shown,
                "seconds": round(self.seconds, 3), "budget_spent": self.budget_spent}


def audit_outbound(model_before: nn.Module, update: Update, inputs: torch.Tensor, labels: torch.Tensor, *,
                   training: TrainingSpec, tolerance: float, attacks="auto",
                   strongest: Sequence[str] = ("ig:iterations=300",), gallery: torch.Tensor | None = None,
                   defenses: Sequence[str] = (), budget: str = "quick", time_budget: float = 60.0,
                   num_classes: int | None = None, tokenizer: str | None = None, seed: int = 0) -> OutboundAudit:
    """Attack `update` (computed from `model_before` on `inputs`, `labels`) and decide."""
    from ..api import audit_update
    from ..data.tensors import dataset_from_tensors

    start = time.perf_counter()
    data = dataset_from_tensors(inputs, labels, name="guard", num_classes=num_classes, tokenizer=tokenizer)
    order = _attack_order(attacks, strongest, model_before, data, training, update)
    result = OutboundAudit(False, "no applicable attack", labels_shown=labels_shown(model_before, update, labels))
    result.skipped = [f"{s.attack}: {s.reason}" for s in order[1]]
    for text in order[0]:
        if time.perf_counter() - start > time_budget:
            result.budget_spent = True
            result.reason = (f"time budget of {time_budget:g} s spent before {text}; "
                             + (result.reason if result.attacks_run else "no attack ran"))
            break
        attack_start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            audit = audit_update(model_before, update, data.inputs, data.labels, training=training,
                                 attacks=[text], defenses=tuple(defenses), num_classes=data.num_classes,
                                 seed=seed, budget=budget, lpips="none", gallery=gallery,
                                 tokenizer=tokenizer, data_label="guard")
        result.skipped += [f"{s.attack}: {s.reason}" for s in audit.skipped]
        for run in audit.runs:
            leaks, reason = update_leaks(run.per_image, tolerance)
            exposed = _exposure(run.per_image)[0]
            result.attacks_run.append({"attack": text, "seconds": round(time.perf_counter() - attack_start, 3),
                                       "exposed": exposed, "examples": len(run.per_image)})
            result.attack, result.reason = text, f"{text}: {reason}"
            if leaks:
                result.leaks = True
                break
        if result.leaks:
            break
    result.seconds = time.perf_counter() - start
    return result


def _attack_order(attacks, strongest: Sequence[str], model: nn.Module, data, training: TrainingSpec,
                  update: Update):
    """The attacks to run, cheapest first, and the skipped ones: "auto" is the analytic
    attacks that apply, then the first of `strongest` that applies."""
    from ..api import select_attacks
    from ..threat import expected_view, make_threat_model

    view = expected_view(make_threat_model("honest", ()), training, update.samples, update.clients)
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


def labels_shown(model: nn.Module, update: Update, labels: torch.Tensor) -> dict | None:
    """The classes the head's bias update points at (negative entries: the loss pushed those
    logits up, so their examples were in the batch), against the classes trained on: the
    label leakage of iDLG (Zhao et al.), exact for one FedSGD step."""
    try:
        from ..models import last_linear

        name, head = last_linear(model)
    except ValueError:
        return None
    bias = update.tensors.get(f"{name}.bias")
    if head.bias is None or bias is None or labels.dim() != 1:
        return None
    shown = sorted(int(i) for i in (bias < 0).nonzero().flatten())
    present = sorted({int(v) for v in labels})
    return {"shown": shown, "present": present, "exact": shown == present}
