"""Attacking the updates a `FlowerAudit` captured, one (round, client, threat model, attack)
at a time: each result goes to the results store as soon as it finishes, a progress line
names what runs, and a rerun of the same audit skips what the store already holds.

Each attack runs once, under the weakest of the audit's threat models that grants what it
needs (`with_weaker_threats` in gradleak.analysis lends the weaker rows to the stronger
verdicts). An honest-server attack reads the update the server captured. A malicious-server
attack needs the client to train on the model the server crafted, which the app's clients
did not: the auditor replays the client's declared training, whose replay of the captured
update the honest check confirmed (`CapturedUpdate.training_check`), on the crafted model with
the client's own examples in their own order — what this client would have sent back, had
the server crafted its model in this round.
"""
from __future__ import annotations

import copy
import hashlib
import json
import sys
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..data.base import tensors_digest
from ..errors import GradleakError

if TYPE_CHECKING:
    from ..api import AuditResult

# the hook's types (gradleak.flower.hook imports this module, not the other way round)
FlowerAudit = Any
CapturedUpdate = Any

# from the weakest server to the strongest: an attack runs under the first that allows it
THREAT_ORDER = ("honest", "informed", "malicious")
SWEEP = "flower"


@dataclass(frozen=True)
class PlannedAttack:
    """One attack on one captured update, under one threat model, with its resume key."""

    captured: CapturedUpdate
    threat: str
    attack: str
    key: str


def attack_captured(audit: FlowerAudit, captured: list[CapturedUpdate], run_config: dict,
                    show_progress: bool = True) -> dict:
    """Attack every captured update as `audit` says; returns counts and timing
    (`ran`, `resumed`: found in the store and not run again, `not_run`: skipped attacks)."""
    from ..store import ResultStore

    start = time.perf_counter()
    plans, skipped = [], []
    for item in captured:
        planned, not_run = plan(audit, item, run_config)
        plans += planned
        skipped += not_run
    done = stored_keys(audit.store_path)
    counts = {"ran": 0, "resumed": 0, "not_run": len(skipped)}
    with ResultStore(audit.store_path):
        pass  # the store exists from here on, whatever is interrupted later
    for result, item in skipped:
        result.save(audit.store_path, sweep=SWEEP, labels=_labels(item))
    say = _printer(show_progress)
    total = len(plans)
    kinds: dict[int, str] = {}  # each captured update's modality, as its data declare it
    for index, item in enumerate(plans, 1):
        what = f"[{index}/{total}] round {item.captured.round} client {_client(item.captured)} " \
               f"{item.threat} {item.attack}"
        if item.key in done:
            counts["resumed"] += 1
            say(f"{what}: stored before, skipped")
            continue
        say(f"{what} ...")
        began = time.perf_counter()
        result = run_planned(audit, item)
        result.save(audit.store_path, sweep=SWEEP, labels=_labels(item))
        counts["ran"] += 1
        if show_progress and id(item.captured) not in kinds:
            kinds[id(item.captured)] = captured_data(audit, item.captured).modality
        say(f"{what}: {outcome_words(result, kinds.get(id(item.captured), 'image'))} "
            f"({time.perf_counter() - began:.0f} s)")
    counts["seconds"] = round(time.perf_counter() - start, 3)
    return counts


def plan(audit: FlowerAudit, captured: CapturedUpdate, run_config: dict
         ) -> tuple[list[PlannedAttack], list[tuple["AuditResult", PlannedAttack]]]:
    """The attacks to run on one captured update (each under the weakest threat model of
    the audit that allows it) and those no threat model allows, as store rows with reasons."""
    from ..api import AuditResult, select_attacks
    from ..threat import expected_view, make_threat_model

    data = captured_data(audit, captured)
    threats = ordered_threats(audit.threats)
    chosen: dict[str, str] = {}
    reasons: dict[str, tuple[str, Any]] = {}
    for threat in threats:
        view = expected_view(make_threat_model(threat, tuple(audit.knows)), captured.training,
                             captured.update.samples, captured.update.clients)
        selected, skipped = select_attacks(audit.attacks, captured.model, data.input_shape, data.num_classes,
                                           data.modality, view, audit.budget, captured.training,
                                           captured.update.samples)
        for text in selected:
            chosen.setdefault(text, threat)
        for skip in skipped:
            reasons[skip.attack] = (threat, skip)
    planned = [PlannedAttack(captured, threat, text, resume_key(audit, captured, threat, text, run_config))
               for text, threat in chosen.items()]
    not_run = []
    for text, (threat, skip) in reasons.items():
        if text in chosen:
            continue
        item = PlannedAttack(captured, threat, text, resume_key(audit, captured, threat, text, run_config))
        not_run.append((AuditResult([], [skip], _setting(audit, captured, data, threat), tolerance=audit.tolerance),
                        item))
    return planned, not_run


def run_planned(audit: FlowerAudit, item: PlannedAttack,
                progress: Callable[[int, int, float], None] | None = None) -> "AuditResult":
    """One attack on one captured update: on the captured update itself, or (a malicious
    server's attack) on the declared training replayed on the model it crafts."""
    from ..api import AuditResult, SkippedAttack, TrainingMismatchWarning, audit_update
    from ..attacks import make_attack

    captured = item.captured
    if not make_attack(item.attack).malicious:
        with warnings.catch_warnings():
            # the hook warned once for this update when it captured it
            warnings.simplefilter("ignore", TrainingMismatchWarning)
            return audit_update(captured.model, captured.update, captured.inputs, captured.labels,
                                training=captured.training, attacks=[item.attack], threat=item.threat,
                                knows=audit.knows, seed=audit.seed, budget=audit.budget,
                                num_classes=audit.num_classes, tokenizer=audit.tokenizer, lpips=audit.lpips,
                                model_label=_model_label(captured), data_label=_data_label(captured),
                                gallery=_given_gallery(audit))
    data = captured_data(audit, captured)
    setting = _setting(audit, captured, data, item.threat)
    try:
        run = _malicious_run(audit, item, data, progress)
    except GradleakError as exc:
        return AuditResult([], [SkippedAttack(item.attack, str(exc))], setting, captured.training_check,
                           tolerance=audit.tolerance)
    run.extras["training_check"] = setting["training_check"]
    run.extras["replayed_training"] = True  # the client's training on the crafted model, replayed
    return AuditResult([run], [], setting, captured.training_check, tolerance=audit.tolerance)


def _malicious_run(audit: FlowerAudit, item: PlannedAttack, data, progress):
    """As gradleak.run.experiment.run_scenario attacks one client, with this client's examples in
    its own order and its declared training."""
    from ..api import BUDGET_DOUBLINGS
    from ..api.inputs import gallery_inputs
    from ..attacks import AttackContext, make_attack
    from ..fl import compute_update
    from ..metrics.reidentify import Gallery
    from ..run.experiment import AttackRunSpec, attack_observations, pick_device, training_fields
    from ..threat import make_threat_model, observe

    start = time.perf_counter()
    captured = item.captured
    if captured.training_check is None or captured.training_check.confirmed is not True:
        note = captured.training_check.note if captured.training_check is not None else "not checked"
        raise GradleakError("a malicious server's model is replayed with the client's declared training, which "
                            f"did not reproduce the captured update ({note})")
    attack = make_attack(item.attack)
    threat = make_threat_model(item.threat, tuple(audit.knows))
    training = captured.training
    device = pick_device("auto")
    spec = AttackRunSpec(dataset=_data_label(captured), model=_model_label(captured), attack=item.attack,
                         batch_size=len(data), **training_fields(training), seed=audit.seed, threat=item.threat,
                         knows=tuple(audit.knows), lpips=audit.lpips, device="auto",
                         doublings=BUDGET_DOUBLINGS[audit.budget])
    ctx = AttackContext(seed=audit.seed, device=device, progress=progress)
    prepared = attack.prepare_model(copy.deepcopy(captured.model), data.input_shape, data.num_classes, ctx)
    crafted = prepared.model.to("cpu")
    x, y = data.inputs, data.labels
    update = compute_update(crafted, x, y, training)
    obs = observe(update, copy.deepcopy(crafted), threat, input_shape=data.input_shape,
                  num_classes=data.num_classes, training=training, batch_size=len(x), labels=y,
                  defenses=(), modality=data.modality, tokenizer=data.tokenizer, server_secrets=prepared.secrets,
                  inputs=x)
    given = _given_gallery(audit)
    judge = None
    if given is not None:
        inputs, labels = gallery_inputs(given, data)
        judge = Gallery(inputs.to(x.dtype), "examples given as the gallery", labels=labels)
    # the one run pipeline, on the one observed (replayed) update
    return attack_observations(spec, attack, [(obs, x, y)], judge, device, progress, started=start)


def _given_gallery(audit: FlowerAudit):
    """The app's gallery as `audit_update` takes it: (inputs, labels), or inputs alone."""
    given = audit.gallery_examples()
    if given is None:
        return None
    return given[0] if given[1] is None else given


def captured_data(audit: FlowerAudit, captured: CapturedUpdate):
    """The client's examples as a gradleak Dataset fitted to the model's classes."""
    from ..data.tensors import dataset_from_tensors
    from ..models.references import fit_classes

    data = dataset_from_tensors(captured.inputs, captured.labels, name=_data_label(captured),
                                num_classes=audit.num_classes, tokenizer=audit.tokenizer)
    return fit_classes(captured.model, data)


def ordered_threats(threats: tuple[str, ...]) -> list[str]:
    """The audit's threat models, weakest first (a preset with extra knowledge after its preset)."""
    rank = {name: i for i, name in enumerate(THREAT_ORDER)}
    return sorted(dict.fromkeys(threats), key=lambda t: (rank.get(t.split("+")[0], len(rank)), t))


def resume_key(audit: FlowerAudit, captured: CapturedUpdate, threat: str, attack: str, run_config: dict) -> str:
    """What decides one attack's result: the app's run config (which fixes every model the
    server sends), the round and client, the client's examples, the gallery, the attack and the
    audit's settings, and how linkage is judged (within a class since 2026-11-29, so a store of
    results judged against the whole gallery is not resumed into). Not the sent weights
    themselves: a later round's FedAvg sum may round differently from one run to the next."""
    given = audit.gallery_examples()
    text = json.dumps({"run_config": {k: run_config[k] for k in sorted(run_config)}, "round": captured.round,
                       "client": _client(captured), "data": tensors_digest(captured.inputs, captured.labels),
                       "gallery": None if given is None else tensors_digest(*(t for t in given if t is not None)),
                       "linkage": "within label", "threat": threat,
                       "attack": attack, "knows": sorted(audit.knows), "budget": audit.budget, "seed": audit.seed,
                       "lpips": audit.lpips, "model": _model_label(captured)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def stored_keys(store_path) -> set[str]:
    """Resume keys of the attacks the store already holds (run, or not run with a reason)."""
    from ..store import ResultStore

    if not store_path.is_file():
        return set()
    with ResultStore(store_path, create=False) as store:
        return {c.labels.get("flower_key") for c in store.cells() if c.sweep == SWEEP and c.kind != "failed"} - {None}


def _labels(item: PlannedAttack) -> dict:
    # keyed by round and client (not the run's random node id), and by what decides the result
    return {"round": item.captured.round, "client": _client(item.captured), "flower_key": item.key}


def _setting(audit: FlowerAudit, captured: CapturedUpdate, data, threat: str) -> dict:
    from ..api.setting import Setting
    from ..data.base import data_digest
    from ..models.base import model_digest

    return Setting(dataset=_data_label(captured), model=_model_label(captured),
                   model_digest=model_digest(captured.model), data_digest=data_digest(data),
                   batch_size=len(data), training=captured.training, seed=audit.seed,
                   threat=threat, budget=audit.budget, defenses=(), captured=True,
                   training_check=captured.training_check).as_dict()


def _client(captured: CapturedUpdate) -> int:
    return captured.partition_id if captured.partition_id is not None else captured.node_id


def _data_label(captured: CapturedUpdate) -> str:
    return f"flower round {captured.round}"


def _model_label(captured: CapturedUpdate) -> str:
    return type(captured.model).__name__


def outcome_words(result: "AuditResult", modality: str) -> str:
    """The attack's result in a few words: its data's headline score (pictures and token
    sequences), how many examples were copied and re-identified."""
    from ..modalities import modality as modality_of

    if not result.runs:
        return f"not run: {result.skipped[0].reason}" if result.skipped else "nothing ran"
    m = result.runs[0].metrics
    parts = []
    headline = modality_of(modality).outcome_headline(m)
    if headline is not None:
        parts.append(headline)
    count = len(result.runs[0].per_example)
    if m.get("asr") is not None:
        parts.append(f"{round(m['asr'] * count)} of {count} copied")
    if m.get("reid") is not None:
        parts.append(f"{round(m['reid'] * count)} re-identified")
    return ", ".join(parts) or "done"


def _printer(enabled: bool) -> Callable[[str], None]:
    def say(line: str) -> None:
        if enabled:
            print(f"gradleak flower: {line}", file=sys.stderr, flush=True)
    return say
