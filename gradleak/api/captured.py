"""`audit_update`: attack one update a server captured from a real client (e.g. a Flower
run), after checking that the declared training reproduces it."""
from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import nn

from ..attacks import Attack, make_attack
from ..data import Dataset
from ..data.base import data_digest
from ..defenses import make_chain
from ..errors import GradleakError
from ..fl import TrainingSpec
from ..fl.training_check import TrainingMismatchWarning, check_declared_training
from ..fl.update import Update, check_update_fits
from ..metrics.reidentify import Gallery
from ..models.base import model_digest
from ..models.model_check import warn_if_output_ignores_input
from ..models.references import fit_classes
from ..run.experiment import attack_observations
from ..run.scenario.spec import AttackRunResult, AttackRunSpec, pick_device, training_fields
from ..threat import ThreatModel, expected_view, make_threat_model, observe
from .inputs import GivenGallery, artifacts_folder, gallery_inputs
from .result import AuditResult
from .selection import BUDGET_DOUBLINGS, SkippedAttack, check_budget, select_attacks
from .setting import Setting


def audit_update(model: nn.Module, update: Update, inputs: torch.Tensor, labels: torch.Tensor, *,
                 training: TrainingSpec, attacks: str | Sequence[str | Attack] = "auto",
                 threat: str = "honest", knows: Iterable[str] = (), defenses: Sequence[str] = (),
                 num_classes: int | None = None, seed: int = 0, budget: str = "quick",
                 lpips: str = "alex", device: str = "auto", model_label: str | None = None,
                 data_label: str = "captured", gallery: GivenGallery | None = None,
                 artifacts: str | Path | None = None, tokenizer: str | None = None,
                 time_budget: float | None = None) -> AuditResult:
    """Attack one update the server received (e.g. captured from a Flower run).

    `model` is the global model the server sent, with the weights before local
    training; `update` what came back (kind "delta" is sent minus returned
    weights; its `buffers`, when the client sent them, its batch-norm buffers after
    training, which give the server the batch's BN statistics after one local step);
    `inputs`/`labels` the batch the client trained on, used only to score the
    reconstruction. `defenses` names what the client applied, as the
    threat model may grant that knowledge. Malicious-server attacks are skipped:
    the update was computed on the model the server actually sent. `gallery`:
    other examples of the clients' data distribution (not this batch), inputs or (inputs,
    labels), among which the auditor re-identifies the reconstructions, linking each among
    its own class's where labels are given; without one, only exact copies can show a leak.
    `artifacts`: as for `audit` (default $GRADLEAK_CACHE/artifacts).
    `tokenizer`: for token ids, the vocabulary they come from ("gpt2", "minilm"), so that the
    scores compare texts; None compares the ids. `time_budget`: seconds for the whole audit,
    kept inside the attacks (an attack past it stops where it is, and its ladder decides nothing).
    """
    from ..data.tensors import dataset_from_tensors

    start = time.perf_counter()
    deadline = None if time_budget is None else start + time_budget
    check_budget(budget)
    threat_model = make_threat_model(threat, tuple(knows))
    update.check_finite()
    data = dataset_from_tensors(inputs, labels, name=data_label, num_classes=num_classes, tokenizer=tokenizer)
    data = fit_classes(model, data)
    check_update_fits(model, update)
    # whether the client sent its buffers is what the update shows, whatever `training` says
    training = dataclasses.replace(training, sends_buffers=bool(update.buffers))
    training_check = check_declared_training(model, update, data.inputs, data.labels, training, defenses)
    if training_check.confirmed is False:
        warnings.warn(f"declared training not confirmed: {training_check.note}", TrainingMismatchWarning,
                      stacklevel=2)
    warn_if_output_ignores_input(model, data.inputs)
    expected = expected_view(threat_model, training, update.samples, update.clients)
    selected, skipped = select_attacks(attacks, model, data.input_shape, data.num_classes, data.modality,
                                       expected, budget, training, update.samples)
    judge = None
    if gallery is not None:
        inputs, labels = gallery_inputs(gallery, data)
        judge = Gallery(inputs, "examples given as the gallery", labels=labels)
    label = model_label or type(model).__name__
    runs: list[AttackRunResult] = []
    for text in selected:
        attack = make_attack(text)
        if attack.malicious:
            skipped.append(SkippedAttack(text, "needs the server to send a modified model before the client "
                                               "trains; this update was computed on the model actually sent"))
            continue
        spec = AttackRunSpec(dataset=data_label, model=label, attack=text, batch_size=len(data),
                             defenses=tuple(defenses), **training_fields(training),
                             seed=seed, threat=threat,
                             knows=tuple(knows), lpips=lpips, device=device, doublings=BUDGET_DOUBLINGS[budget])
        try:
            runs.append(_attack_captured(spec, attack, model, update, data, threat_model, training, judge,
                                         artifacts_folder(artifacts, None), deadline))
        except GradleakError as exc:
            skipped.append(SkippedAttack(text, str(exc)))
    setting = Setting(dataset=data_label, model=label, model_digest=model_digest(model),
                      data_digest=data_digest(data), batch_size=len(data), training=training, seed=seed,
                      threat=threat_model.name, budget=budget, defenses=tuple(defenses),
                      seconds=time.perf_counter() - start, captured=True, training_check=training_check)
    for run in runs:  # stored with every row, so that the verdict knows (analysis.verdict)
        run.extras["training_check"] = training_check.to_dict()
    return AuditResult(runs, skipped, setting.as_dict(), training_check)



def _attack_captured(spec: AttackRunSpec, attack: Attack, model: nn.Module, update: Update, data: Dataset,
                     threat: ThreatModel, training: TrainingSpec, gallery: Gallery | None,
                     artifacts: Path | None = None, deadline: float | None = None) -> AttackRunResult:
    start = time.perf_counter()
    device = pick_device(spec.device)
    x, y = data.inputs, data.labels
    sent = copy.deepcopy(model).to("cpu")
    # declared knowledge comes from the ground truth; an update with buffers gives its own (observe)
    obs = observe(update, sent, threat, input_shape=data.input_shape, num_classes=data.num_classes,
                  training=training, batch_size=update.samples, labels=y,
                  defenses=make_chain(spec.defenses).defenses,
                  modality=data.modality, tokenizer=data.tokenizer, inputs=x)
    return attack_observations(spec, attack, [(obs, x, y)], gallery, device, artifacts=artifacts, started=start,
                               deadline=deadline)

