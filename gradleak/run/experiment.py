"""One attack scenario end to end:

data + model → fl client (with defenses) → Observation (threat model) →
attack.reconstruct → metrics (Hungarian-matched) → result.

The scenario's spec and result, its assembly from names, its gallery and its result files
live in `gradleak.run.scenario`; they are importable from here as before.
"""
from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..attacks import Attack, AttackContext, Reconstruction
from ..attacks.base import PreparedModel
from ..data import Dataset
from ..data.references import held_out_examples, resolve_data, run_order
from ..fl import aggregate_updates, compute_update
from ..metrics import summarize
from ..metrics.reidentify import Gallery
from ..modalities.text import sequence_pairs_text
from ..models.model_check import (
    BLIND_CHECK_EXAMPLES,
    BLIND_MODEL_MESSAGE,
    output_ignores_input,
    warn_if_output_ignores_input,
)
from ..seeding import stream
from ..threat import Observation, observe
from .ladder import climb_budget_ladder, convergence_summary, ladder_summary
from .scenario.assembly import (
    build_scenario_model,
    check_scenario,
    pretrained,
    pretraining_data,
    scenario_data,
    scenario_model,
    validate_run_spec,
)
from .scenario.gallery import GALLERY_SIZE, examples_gallery, resolved_gallery
from .scenario.outputs import result_record, write_outputs
from .scenario.spec import AttackRunResult, AttackRunSpec, jsonable, pick_device, training_fields

__all__ = [
    "AttackRunSpec", "AttackRunResult", "training_fields", "pick_device", "jsonable",
    "build_scenario_model", "scenario_data", "scenario_model", "check_scenario", "validate_run_spec",
    "pretraining_data", "run_attack", "run_scenario", "attack_observations", "batch_attack_seed",
    "GALLERY_SIZE", "examples_gallery", "BLIND_CHECK_EXAMPLES", "BLIND_MODEL_MESSAGE",
    "warn_if_output_ignores_input", "output_ignores_input", "result_record", "write_outputs",
    "sequence_pairs_text",
]


def run_attack(spec: AttackRunSpec, progress: Callable[[int, int, float], None] | None = None,
               artifacts: Path | None = None) -> AttackRunResult:
    """Run one scenario named by registry names (or user references). Deterministic given `spec.seed`.
    `artifacts`: the study's folder for what attacks train once and reuse (`AttackContext.artifacts`)."""
    resolved = resolve_data(spec.dataset, spec.split, spec.resize, spec.seq_len)  # the name, parsed once
    data = resolved.dataset
    model = scenario_model(spec, data)
    if spec.pretrain_steps:
        model = pretrained(model, spec)
    # the gallery is drawn from what was resolved, before the run checks the attack
    targets = run_order(len(data), spec.seed)[:spec.images or spec.batch_size]
    gallery = resolved_gallery(resolved.gallery_split, resolved.gallery_draw(targets, GALLERY_SIZE))
    return run_scenario(spec, model, data, progress, held_out=resolved.prior, gallery=gallery, artifacts=artifacts)


def run_scenario(spec: AttackRunSpec, model: nn.Module, data: Dataset,
                 progress: Callable[[int, int, float], None] | None = None,
                 held_out: Callable[[torch.Tensor], Any] | None = None,
                 gallery: Gallery | None = None,
                 artifacts: Path | None = None) -> AttackRunResult:
    """Attack the built `model` on `data` as `spec` describes (its dataset and
    model fields only label the result). The one path behind the CLI, sweeps
    and `gradleak.audit`. `model` is not modified; `held_out(targets)` gives
    held-out examples when the threat model grants them (default: every
    example of `data` that is not a target); `gallery` the examples the auditor
    re-identifies reconstructions among, drawn by the caller before the run from the same
    targets (`data.references.run_order`; default: up to GALLERY_SIZE non-target examples
    of `data`); `artifacts` the folder where attacks keep what they
    train once per setting (None: nothing is kept). An iterative attack climbs its budget
    ladder (gradleak.run.ladder) up to `spec.doublings` doublings."""
    start = time.perf_counter()
    device = pick_device(spec.device)
    attack, chain, threat = check_scenario(spec, data, model)
    training = spec.training()
    n_examples = spec.images or spec.batch_size
    others = chain.aggregate_clients - 1

    # the model the client trains (LoRA adapters added here), the one every attack observes
    model = training.prepare_model(chain.transform_model(copy.deepcopy(model)), spec.seed)
    warn_if_output_ignores_input(model, data.inputs)
    order = run_order(len(data), spec.seed)
    targets = order[:n_examples]
    pool = order[n_examples:]
    prior = None
    if "prior_data" in threat.grants:
        prior = held_out(targets) if held_out is not None else held_out_examples(data, targets)
    ctx = AttackContext(seed=spec.seed, device=device, progress=progress, prior_data=prior, artifacts=artifacts)
    judge = gallery if gallery is not None else examples_gallery(data, targets, f"examples of {data.name}")
    prepared = (attack.prepare_model(model, data.input_shape, data.num_classes, ctx) if attack.malicious
                else PreparedModel(model))
    prepared.model = model = prepared.model.to("cpu")
    server_secrets = prepared.secrets

    def batches():
        for b in range(math.ceil(n_examples / spec.batch_size)):
            idx = targets[b * spec.batch_size:(b + 1) * spec.batch_size]
            x, y = data.inputs[idx], data.labels[idx]
            # Each client's defense randomness is its own stream: clients summed by secure
            # aggregation must not share a noise draw.
            update = compute_update(model, x, y, training, chain, stream(spec.seed, "client", "target", b),
                                    modality=data.modality)
            batch_total = x.shape[0]
            if others:
                updates = [update]
                for k in range(others):
                    oidx = pool[(b * others + k) * spec.batch_size:(b * others + k + 1) * spec.batch_size]
                    # a malicious server may send each client of the group its own model
                    updates.append(compute_update(attack.client_model(prepared, k + 1), data.inputs[oidx],
                                                  data.labels[oidx], training, chain,
                                                  stream(spec.seed, "client", "other", b, k),
                                                  modality=data.modality))
                update = aggregate_updates(updates)
                batch_total = update.samples
            obs = observe(update, copy.deepcopy(model), threat, input_shape=data.input_shape,
                          num_classes=data.num_classes, training=training, batch_size=batch_total,
                          labels=y, defenses=chain.defenses, modality=data.modality, tokenizer=data.tokenizer,
                          prior_data=prior, server_secrets=server_secrets, inputs=x)
            yield obs, x, y

    return attack_observations(spec, attack, batches(), judge, device, progress, artifacts, start)


def attack_observations(spec: AttackRunSpec, attack: Attack, batches: Iterable[tuple[Observation, torch.Tensor,
                                                                                     torch.Tensor]],
                        gallery: Gallery | None, device: torch.device,
                        progress: Callable[[int, int, float], None] | None = None, artifacts: Path | None = None,
                        started: float | None = None, attack_seed: Callable[[int, int], int] | None = None,
                        reconstructions: list[Reconstruction] | None = None,
                        deadline: float | None = None) -> AttackRunResult:
    """The one run pipeline: attack each observed update (simulated by `run_scenario` or
    `gradleak.run.batch_attack`, or captured from a real client, `gradleak.api.audit_update`) up its
    budget ladder, score it against the batch it came from, and gather the result. `batches`
    yields (observation, inputs, labels); `attack_seed(seed, batch)` is the attack's own seed
    for each batch (default `batch_attack_seed`); each batch's final `Reconstruction` is
    appended to `reconstructions` when given. Past `deadline` (time.perf_counter()) an attack
    stops where it is and its ladder decides nothing."""
    start = time.perf_counter() if started is None else started
    seed_of = attack_seed or batch_attack_seed
    scores, originals, recons, iterations, extras, runs, ladders = [], [], [], [], {}, [], []
    kind = "image"
    for b, (obs, x, y) in enumerate(batches):
        kind = obs.modality
        batch_ctx = AttackContext(seed=seed_of(spec.seed, b), device=device, progress=progress,
                                  artifacts=artifacts, deadline=deadline)
        climbed = climb_budget_ladder(attack, obs, x, y, batch_ctx, spec.lpips, gallery, spec.doublings)
        rec, batch_scores, aligned = climbed.reconstruction, climbed.scores, climbed.aligned
        ladders.append(climbed.ladder)
        for s in batch_scores:
            s.index += len(scores)
        scores += batch_scores
        originals.append(x)
        recons.append(aligned)
        iterations.append(rec.iterations)
        runs.append(rec)
        if reconstructions is not None:
            reconstructions.append(rec)
        for key, value in rec.extras.items():
            extras.setdefault(key, []).append(value)

    metrics = summarize(scores)
    metrics["iterations"] = float(sum(iterations) / len(iterations))
    extras["ladder"] = ladder_summary(ladders, gallery)
    return AttackRunResult(spec, metrics, [s.to_dict() for s in scores], time.perf_counter() - start,
                           torch.cat(originals), torch.cat(recons), extras, convergence_summary(runs), modality=kind)


def batch_attack_seed(seed: int, batch: int) -> int:
    """The attack's own seed (initialisation, restarts) for batch `batch` of a run."""
    return seed * 7919 + batch
