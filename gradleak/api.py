"""The public Python API: how much of *your* client's data leaks.

`audit` takes the user's own model (an `nn.Module`, a factory, or a model
reference such as `"lenet"` or `"my_model.py:Net"`) and the client's data (a
torch `Dataset`, a `DataLoader`, `(inputs, labels)` tensors, or a dataset
reference such as `"mnist"`), simulates the client's training with the
defenses applied where a real client applies them, and runs every attack the
threat model allows on it. `audit_update` does the same for an update captured
from a running federation (see `gradleak.flower`).

Both return an `AuditResult`: one `AttackRunResult` per attack that ran, and
every attack that did not, with a one-line reason.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

import torch
from torch import nn

from .attacks import ATTACKS, Attack, make_attack
from .data import Dataset
from .data.references import resolve_data
from .defenses import make_chain
from .errors import GradleakError
from .experiment import (
    AttackRunResult,
    AttackRunSpec,
    attack_observations,
    gallery_for,
    gallery_from,
    pick_device,
    result_record,
    run_scenario,
    training_fields,
    warn_if_output_ignores_input,
)
from .fl import TrainingSpec
from .fl.update import Update
from .ladder import LADDER_DOUBLINGS
from .leakage import SAMPLE_SEED_OFFSET, Tolerance, parse_tolerance, sample_target
from .metrics.reidentify import Gallery
from .models.base import hash_weights
from .models.references import fit_classes, resolve_model
from .options import ComponentSpec, parse_spec
from .threat import ThreatModel, capture_bn_statistics, expected_view, make_threat_model, observe

__all__ = ["audit", "audit_update", "AuditResult", "SkippedAttack", "select_attacks", "BUDGETS",
           "TrainingCheck", "TrainingMismatchWarning", "check_declared_training"]

# Budget presets: "quick" fits a laptop CPU in minutes, "standard" is each
# attack's own defaults, "thorough" spends more iterations or restarts. Each also sets how
# many times the auditor may double an attack's budget while its verdict is undecided.
BUDGETS = ("quick", "standard", "thorough")
BUDGET_DOUBLINGS = {"quick": 2, "standard": LADDER_DOUBLINGS, "thorough": 4}
# A captured update is reproduced by the declared training when replaying that training on the
# ground truth lands within this fraction of the update's largest entry. A replay of the very
# training torch.optim ran differs by float32 rounding only (measured on the Flower example's
# CNN, 2-12 shuffled steps: up to 4e-7 with SGD momentum, 7.5e-6 with Adam/AdamW), while the
# subtlest mis-declaration measured there, weight decay 5e-4 left out, differs by 7e-4 (another
# optimizer, epoch count, learning rate or shuffle seed: 0.3 to 1.4).
TRAINING_CHECK_TOLERANCE = 1e-4


class TrainingMismatchWarning(UserWarning):
    """The declared training, replayed on the ground truth, does not reproduce the captured update."""


@dataclass(frozen=True)
class TrainingCheck:
    """Whether the declared training, replayed on the client's ground-truth examples from the
    weights the server sent, reproduces the update the server captured."""

    checked: bool
    difference: float | None = None  # max |captured - replayed| / max |replayed|
    tolerance: float = TRAINING_CHECK_TOLERANCE
    note: str = ""  # why it was not checked, or the mismatch in words

    @property
    def confirmed(self) -> bool | None:
        """True or False when checked, None when the update could not be checked."""
        return None if self.difference is None else self.difference <= self.tolerance

    def to_dict(self) -> dict:
        return {"checked": self.checked, "confirmed": self.confirmed, "difference": self.difference,
                "tolerance": self.tolerance, "note": self.note}


@dataclass(frozen=True)
class SkippedAttack:
    """An attack that did not run, and why (one line)."""

    attack: str
    reason: str

    def to_dict(self) -> dict:
        return {"attack": self.attack, "reason": self.reason}


@dataclass
class AuditResult:
    """The attacks that ran (with the CLI's metrics each) and those that were skipped."""

    runs: list[AttackRunResult]
    skipped: list[SkippedAttack]
    setting: dict = field(default_factory=dict)
    # for a captured update: whether the declared training reproduced it (audit_update)
    training_check: TrainingCheck | None = None
    # what the user accepts: the verdict's "holds" means every attack meets it
    tolerance: Tolerance = field(default_factory=Tolerance)

    def __repr__(self) -> str:
        s = self.setting
        return (f"AuditResult({len(self.runs)} attack run(s), {len(self.skipped)} skipped; "
                f"{s.get('model')} on {s.get('dataset')}, batch {s.get('batch_size')}, "
                f"defenses: {', '.join(s.get('defenses') or []) or 'none'})")

    def by_attack(self) -> dict[str, dict]:
        """Attack spec → its summary metrics."""
        return {r.spec.attack: r.metrics for r in self.runs}

    def verdicts(self) -> list[dict]:
        """The strongest-attack entries of `gradleak.analysis` for this audit's setting(s):
        verdict, verdict_text, grade, re-identification counts, ..."""
        from .analysis import strongest_attacks

        return strongest_attacks(self.records(), self.tolerance)

    def summary(self) -> str:
        """The verdict in a few lines: the setting, the verdict in words, then one line per
        attack (PSNR, SSIM, re-identified, budget and how its ladder ended) and what was
        skipped."""
        s = self.setting
        lines = [f"{s.get('model')} on {s.get('dataset')}, batch {s.get('batch_size')}, "
                 f"{s.get('local_steps')} local step(s), defenses: {', '.join(s.get('defenses') or []) or 'none'}, "
                 f"threat model {s.get('threat')}, seed(s) {', '.join(map(str, self.seeds())) or '–'}"]
        for entry in self.verdicts():
            lines.append(f"verdict: {entry['verdict_text']}")
        for run in self.runs:
            lines.append("  " + run.summary())
        for skip in self.skipped:
            lines.append(f"  not run: {skip.attack}: {skip.reason}")
        if self.training_check is not None and self.training_check.confirmed is False:
            lines.append(f"  training not confirmed: {self.training_check.note}")
        return "\n".join(lines)

    def seeds(self) -> list[int]:
        return sorted({r.spec.seed for r in self.runs})

    def records(self) -> list:
        """The store rows this result is saved as (without images)."""
        from .store import CellRecord
        from .sweep import attack_labels, cell_key

        out = []
        for run in self.runs:
            spec = {**json.loads(json.dumps(run.spec.to_dict(), default=list)), **self._identity()}
            record = result_record(run, images=False)
            labels = {**attack_labels(run.spec), "tolerance": self.tolerance.to_text()}
            out.append(CellRecord(cell_key("attack", spec), "attack", "audit", spec, labels,
                                  record["metrics"], record["extras"], record["seconds"]))
        return out

    def strongest(self, metric: str = "mse") -> AttackRunResult | None:
        """The run with the best reconstruction by `metric` (lowest MSE/LPIPS, highest PSNR/SSIM/ASR)."""
        lower_better = metric in ("mse", "rmse", "lpips")
        scored = [r for r in self.runs if r.metrics.get(metric) is not None]
        if not scored:
            return None
        pick = min if lower_better else max
        return pick(scored, key=lambda r: r.metrics[metric])

    def to_json(self) -> dict:
        return {"setting": self.setting, "runs": [r.to_json() for r in self.runs],
                "skipped": [s.to_dict() for s in self.skipped]}

    def save(self, store_path: str | Path, sweep: str = "audit", labels: dict | None = None) -> int:
        """Write one store row per attack that ran and one per skipped attack;
        `labels` (e.g. round and client) are added to every row and its key.
        Returns the number of rows written (rows already present are kept)."""
        from .store import CellRecord, ResultStore
        from .sweep import attack_labels, cell_key, store_result_record

        extra = dict(labels or {})
        written = 0
        with ResultStore(store_path) as store:
            for run in self.runs:
                spec = {**json.loads(json.dumps(run.spec.to_dict(), default=list)), **self._identity(), **extra}
                row_labels = {**attack_labels(run.spec), "tolerance": self.tolerance.to_text(), **extra}
                written += store_result_record(store, sweep, "attack", spec, row_labels, result_record(run))
            for skip in self.skipped:
                spec = {"attack": skip.attack, "threat": self.setting.get("threat"), **self._scenario_labels(),
                        **self._identity(), **extra}
                row_labels = {"attack": parse_spec(skip.attack, "attack").name, "attack_spec": skip.attack,
                              "reason": skip.reason, **self._scenario_labels(), **extra}
                record = CellRecord(cell_key("skipped", spec), "skipped", sweep, spec, row_labels,
                                    {}, {"reason": skip.reason}, 0.0)
                written += store.add_cell(record)
        return written

    def write_report(self, out: str | Path, store_path: str | Path | None = None) -> Path:
        """Save into `store_path` (default OUT/results.db) and write OUT/index.html."""
        from .report import write_report

        out = Path(out)
        store_path = Path(store_path) if store_path is not None else out / "results.db"
        self.save(store_path)
        return Path(write_report(store_path, out, self.tolerance)["html"])

    def _identity(self) -> dict:
        return {k: self.setting[k] for k in ("model_digest", "data_digest") if k in self.setting}

    def _scenario_labels(self) -> dict:
        s = self.setting
        return {"dataset": s.get("dataset"), "model": s.get("model"), "batch_size": s.get("batch_size"),
                "local_steps": s.get("local_steps"), "seed": s.get("seed"),
                "defense": s.get("defense", "none"), "strength": s.get("strength", ""),
                "defenses": s.get("defenses", [])}


def audit(model: nn.Module | Callable[[], nn.Module] | str, data: Any, *,
          attacks: str | Sequence[str | Attack] = "auto",
          defenses: Sequence[str | Any] = (),
          threat: str = "honest", knows: Iterable[str] = (),
          training: TrainingSpec | None = None, lr: float = 0.1, local_steps: int = 1,
          local_epochs: int | None = None, local_batch_size: int | None = None,
          bn_mode: Literal["train", "eval"] = "train", optimizer: str = "sgd", shuffle_seed: int | None = None,
          sends_buffers: bool = False,
          batch_size: int = 1, images: int | None = None, seed: int | Sequence[int] = 0, budget: str = "quick",
          lpips: str = "alex", device: str = "auto", checkpoint: str | None = None,
          split: str = "test", resize: int | None = None, seq_len: int | None = None, gallery: Any = None,
          out: str | Path | None = None, progress: bool = False,
          artifacts: str | Path | None = None, tolerance: Any = None,
          sample_rungs: int = 0, max_examples: int = 64) -> AuditResult:
    """Attack a simulated client that trains `model` on `data` and sends its update.

    model:   an `nn.Module` (not modified), a zero-argument factory, or a model
             reference (`"lenet"`, `"convnet:width=64"`, `"path/to/file.py:factory:k=v"`).
    data:    `(inputs, labels)`, a torch `Dataset` or `DataLoader`, a gradleak
             `Dataset`, or a dataset reference (`"mnist"`, `"tensors:path=FILE"`).
             Images are float in [0, 1] (or uint8), shaped (N, C, H, W).
    attacks: `"auto"` (every registered attack the threat model and the
             architecture allow, at the `budget` preset) or a list of
             `"name:k=v"` strings / `Attack` objects.
    defenses: `"name:k=v"` strings or `Defense` objects, applied in order where a
             real client applies each (data, per-step gradient, final update).
    training: the client's local training (FedSGD when one step on the whole
             batch); alternatively `lr`, `local_steps`, `local_epochs`,
             `local_batch_size`, `bn_mode`, `optimizer` (`"sgd:momentum=0.9,weight_decay=5e-4"`,
             `"adam"`, `"adamw"`: replayed with torch.optim's semantics), `shuffle_seed`
             (the client's shuffling DataLoader generator seed, known to the server),
             `sends_buffers` (the client sends its batch-norm running statistics with its
             update, as a Flower client returning its state dict does: after one local step
             on the whole batch they give every threat model the batch's BN statistics).
    seed:    one seed or several (a verdict of `holds` needs two or more).
    budget:  `quick`, `standard` or `thorough`: each attack's first budget, and how many
             times (2, 3, 4) the auditor may double it while its verdict is undecided.
    seq_len: tokens per sequence of a named text dataset (`"news"`, `"polarity"`; default
             the dataset's own).
    gallery: more examples of your data's distribution, not among those the client
             trains on (tensors, a Dataset or DataLoader): reconstructions are
             re-identified among them and the examples of `data` that were not attacked.
    tolerance: what you accept (`gradleak.leakage.Tolerance`, a mapping, or
             `"linkage=0.6,recognizable=0.1"`): `holds` means every saturated attack's linkage
             AUC and recognizable rate are bounded within it at 95%.
    sample_rungs, max_examples: while a verdict is still open (too few examples to bound the
             rates), up to `sample_rungs` more rounds attack more examples of `data` (new seeds,
             each drawing its own examples, which may repeat ones drawn before when `data` is
             small), until each attack was judged on `max_examples`. Default 0: none are added,
             and an open verdict says how many examples would bound the rates (or pass `images`).
    out:     when given, the store and the HTML report are written there.
    artifacts: the folder where attacks keep what they train once per setting (the learned
             inverters), so that later calls with the same model, defenses and training reuse
             it; default `out`/artifacts, else $GRADLEAK_CACHE/artifacts (~/.cache/gradleak).
    """
    start = time.perf_counter()
    kept = _artifacts_folder(artifacts, out)
    training = training or TrainingSpec(lr=lr, local_steps=local_steps, local_epochs=local_epochs,
                                        local_batch_size=local_batch_size, batchnorm=bn_mode, optimizer=optimizer,
                                        shuffle_seed=shuffle_seed, sends_buffers=sends_buffers)
    _check_budget(budget)
    seeds = _seeds(seed)
    tolerance = parse_tolerance(tolerance)
    if not isinstance(sample_rungs, int) or isinstance(sample_rungs, bool) or not 0 <= sample_rungs <= 10:
        raise GradleakError(f"sample_rungs must be an integer from 0 to 10, got {sample_rungs!r}")
    if not isinstance(max_examples, int) or isinstance(max_examples, bool) or max_examples < 1:
        raise GradleakError(f"max_examples must be a positive integer, got {max_examples!r}")
    threat_model = make_threat_model(threat, tuple(knows))
    dataset, data_label, prior_loader = resolve_data(data, split, resize, seq_len)
    extra_gallery = _gallery_inputs(gallery, dataset) if gallery is not None else None
    defense_texts = tuple(_component_text(d, "defense") for d in defenses)
    runs: list[AttackRunResult] = []
    skipped: list[SkippedAttack] = []

    def attack_seed(run_seed: int, examples: int | None, only: set[str] | None = None) -> tuple[nn.Module, str]:
        nonlocal dataset
        built, model_label = resolve_model(model, dataset, run_seed)
        if checkpoint:
            from .models.checkpoint import load_checkpoint
            load_checkpoint(built, checkpoint)
        dataset = fit_classes(built, dataset)
        expected = expected_view(threat_model, training, batch_size, make_chain(defense_texts).aggregate_clients)
        selected, not_run = select_attacks(attacks, built, dataset.input_shape, dataset.num_classes,
                                           dataset.modality, expected, budget, training, batch_size)
        if run_seed == seeds[0]:
            skipped.extend(not_run)
        base = AttackRunSpec(dataset=data_label, model=model_label, attack="ig", batch_size=batch_size,
                             defenses=defense_texts, images=examples, **training_fields(training),
                             seed=run_seed, threat=threat,
                             knows=tuple(knows), seq_len=seq_len, lpips=lpips, device=device,
                             doublings=BUDGET_DOUBLINGS[budget])
        judge = _gallery_maker(data, dataset, split, resize, extra_gallery, seq_len)
        for text in selected:
            if only is not None and text not in only:
                continue
            spec = dataclasses.replace(base, attack=text)
            try:
                runs.append(_run_with_progress(spec, built, dataset, prior_loader, judge, progress, kept))
            except GradleakError as exc:
                if run_seed == seeds[0]:
                    skipped.append(SkippedAttack(text, str(exc)))
        return built, model_label

    for run_seed in seeds:
        built, model_label = attack_seed(run_seed, images)
    for rung in range(1, sample_rungs + 1):
        # the sample ladder: fresh examples (new seeds) while the verdict is still open
        entries = AuditResult(runs, skipped, {}, tolerance=tolerance).verdicts()
        open_entries = [e for e in entries if e.get("open")]
        if not open_entries:
            break
        have = min(e.get("min_examples") or 1 for e in open_entries)
        target = sample_target(have, max(e.get("needed_examples") or 0 for e in open_entries), max_examples)
        missing = target - have
        if missing <= 0 or len(dataset) < batch_size:
            break
        per_seed = min(len(dataset), math.ceil(missing / len(seeds) / batch_size) * batch_size)
        for run_seed in seeds:
            attack_seed(run_seed + SAMPLE_SEED_OFFSET * rung, per_seed)
    setting = {"dataset": data_label, "model": model_label, "batch_size": batch_size,
               "local_steps": training.local_steps, "local_epochs": training.local_epochs,
               "lr": training.lr, "seed": seeds[0], "seeds": seeds, "threat": threat_model.name, "budget": budget,
               "defenses": list(defense_texts), **_defense_labels(defense_texts),
               "model_digest": _model_digest(built), "data_digest": _data_digest(dataset),
               "seconds": time.perf_counter() - start}
    result = AuditResult(runs, skipped, setting, tolerance=tolerance)
    if out is not None:
        result.write_report(out)
    return result


def _seeds(seed: int | Sequence[int]) -> list[int]:
    values: list = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise GradleakError(f"seed must be an integer >= 0 or a list of them, got {seed!r}")
    return [int(v) for v in dict.fromkeys(values)]


def _gallery_inputs(gallery: Any, like: Dataset) -> torch.Tensor:
    """The user's gallery examples as inputs shaped like the audited data's."""
    from .data.tensors import dataset_from_user

    if isinstance(gallery, torch.Tensor):
        gallery = (gallery, torch.zeros(len(gallery), dtype=torch.long))
    extra = dataset_from_user(gallery)
    if extra.input_shape != like.input_shape:
        raise GradleakError(f"gallery examples have shape {extra.input_shape}, the audited data "
                            f"{like.input_shape}")
    return extra.inputs


def _gallery_maker(data: Any, dataset: Dataset, split: str, resize: int | None,
                   extra: torch.Tensor | None, seq_len: int | None = None) -> Callable[[torch.Tensor], Gallery]:
    """The re-identification gallery of an audit, given the attacked examples: a named
    dataset's other split, or the examples of the user's data not attacked; plus `extra`."""
    def make(targets: torch.Tensor) -> Gallery:
        if isinstance(data, str):
            base = gallery_for(data, split, resize, dataset, targets, seq_len)
        else:
            base = gallery_from(dataset, targets, "other examples of your data")
        if extra is None:
            return base
        return Gallery(torch.cat([base.inputs, extra.to(base.inputs.dtype)]),
                       f"{base.source} and of the gallery you gave", None)
    return make


def audit_update(model: nn.Module, update: Update, inputs: torch.Tensor, labels: torch.Tensor, *,
                 training: TrainingSpec, attacks: str | Sequence[str | Attack] = "auto",
                 threat: str = "honest", knows: Iterable[str] = (), defenses: Sequence[str] = (),
                 num_classes: int | None = None, seed: int = 0, budget: str = "quick",
                 lpips: str = "alex", device: str = "auto", model_label: str | None = None,
                 data_label: str = "captured", gallery: torch.Tensor | None = None,
                 artifacts: str | Path | None = None, tokenizer: str | None = None) -> AuditResult:
    """Attack one update the server received (e.g. captured from a Flower run).

    `model` is the global model the server sent, with the weights before local
    training; `update` what came back (kind "delta" is sent minus returned
    weights; its `buffers`, when the client sent them, its batch-norm buffers after
    training, which give the server the batch's BN statistics after one local step);
    `inputs`/`labels` the batch the client trained on, used only to score the
    reconstruction. `defenses` names what the client applied, as the
    threat model may grant that knowledge. Malicious-server attacks are skipped:
    the update was computed on the model the server actually sent. `gallery`:
    other examples of the clients' data distribution (not this batch), among which
    the auditor re-identifies the reconstructions; without one, only exact copies
    can show a leak. `artifacts`: as for `audit` (default $GRADLEAK_CACHE/artifacts).
    `tokenizer`: for token ids, the vocabulary they come from ("gpt2", "minilm"), so that the
    scores compare texts; None compares the ids.
    """
    from .data.tensors import dataset_from_tensors

    start = time.perf_counter()
    _check_budget(budget)
    threat_model = make_threat_model(threat, tuple(knows))
    update.check_finite()
    data = dataset_from_tensors(inputs, labels, name=data_label, num_classes=num_classes, tokenizer=tokenizer)
    data = fit_classes(model, data)
    _check_update_fits(model, update)
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
        judge = Gallery(_gallery_inputs(gallery, data), "examples given as the gallery")
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
                                         _artifacts_folder(artifacts, None)))
        except GradleakError as exc:
            skipped.append(SkippedAttack(text, str(exc)))
    setting = {"dataset": data_label, "model": label, "batch_size": len(data),
               "local_steps": training.local_steps, "local_epochs": training.local_epochs, "lr": training.lr,
               "seed": seed, "threat": threat_model.name, "budget": budget, "defenses": list(defenses),
               **_defense_labels(tuple(defenses)), "model_digest": _model_digest(model),
               "data_digest": _data_digest(data), "seconds": time.perf_counter() - start}
    setting["training_check"] = training_check.to_dict()
    for run in runs:  # stored with every row, so that the verdict knows (analysis.verdict)
        run.extras["training_check"] = training_check.to_dict()
    return AuditResult(runs, skipped, setting, training_check)


def check_declared_training(model: nn.Module, update: Update, inputs: torch.Tensor, labels: torch.Tensor,
                            training: TrainingSpec, defenses: Sequence[str] = ()) -> TrainingCheck:
    """Replay the declared `training` from the sent `model` on the client's ground-truth
    `inputs`/`labels` (in the order its data loader indexes them) and compare with the captured
    `update`: the difference is the largest entry-wise gap relative to the replayed update's
    largest entry. Not checked (confirmed None) when something random the auditor cannot
    replay touched the update: declared defenses, an unknown batch order, augmentation, active
    dropout, or other clients' updates summed in."""
    why_not = _why_training_unchecked(model, update, training, defenses)
    if why_not:
        return TrainingCheck(False, note=why_not)
    from .fl import compute_update

    sent = copy.deepcopy(model).to("cpu")
    replayed = compute_update(sent, inputs.detach().cpu(), labels.detach().cpu(), training)
    expected = {n: t.double() for n, t in replayed.tensors.items()}
    captured = {n: t.detach().cpu().double() for n, t in update.tensors.items()}
    # one plain-SGD step replays as a gradient; a delta of it is lr × that gradient
    if replayed.kind == "gradient" and update.kind == "delta":
        expected = {n: t * training.lr for n, t in expected.items()}
    elif replayed.kind == "delta" and update.kind == "gradient":
        captured = {n: t * training.lr for n, t in captured.items()}
    names = sorted(expected.keys() | captured.keys())  # a tensor only one side has counts as zeros
    pairs = [(captured[n] if n in captured else torch.zeros_like(expected[n]),
              expected[n] if n in expected else torch.zeros_like(captured[n])) for n in names]
    gap = max(float((c - e).abs().max()) for c, e in pairs)
    scale = max(float(e.abs().max()) for _, e in pairs) or max(float(c.abs().max()) for c, _ in pairs) or 1.0
    difference = gap / scale
    if difference <= TRAINING_CHECK_TOLERANCE:
        return TrainingCheck(True, difference, note="the declared training reproduces the captured update")
    flat_c = torch.cat([c.reshape(-1) for c, _ in pairs])
    flat_e = torch.cat([e.reshape(-1) for _, e in pairs])
    cosine = float(torch.nn.functional.cosine_similarity(flat_c, flat_e, dim=0))
    ratio = float(flat_c.norm() / flat_e.norm()) if float(flat_e.norm()) else math.inf
    return TrainingCheck(True, difference, note=(
        f"replaying the declared training ({_training_text(training, len(inputs))}) on the ground truth "
        f"gives an update that differs from the captured one by {difference:.2g} of its largest entry "
        f"(tolerance {TRAINING_CHECK_TOLERANCE:g}; cosine {cosine:.3f}, norm ratio {ratio:.3g}): the client's "
        "optimizer or its options, learning rate, local epochs, batch size or batch order likely differ from "
        "the declaration, or a client-side step (clipping, noise, compression) changed the update; the "
        "attacks replayed the declared training, so they may understate the leak"))


def _why_training_unchecked(model: nn.Module, update: Update, training: TrainingSpec,
                            defenses: Sequence[str]) -> str | None:
    if defenses:
        return f"the declared defenses ({', '.join(defenses)}) change the update beyond what the auditor replays"
    if update.clients > 1:
        return f"the update sums {update.clients} clients' updates"
    if not training.replayable:
        return "the client's batch order or augmentation draws are unknown to the auditor"
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0 for m in model.modules()):
        return "the model's dropout masks are drawn by the client and unknown to the auditor"
    return None


def _training_text(training: TrainingSpec, samples: int) -> str:
    steps, batch = training.num_steps(samples), training.step_batch_size(samples)
    epochs = f" over {training.local_epochs} epoch(s)" if training.local_epochs is not None else ""
    order = {"known": f"shuffled with seed {training.shuffle_seed}", "none": "in order"}.get(training.order,
                                                                                             training.order)
    return f"{training.optimizer}, lr {training.lr:g}, {steps} step(s) of batch {batch}{epochs}, {order}"


def select_attacks(attacks: str | Sequence[str | Attack], model: nn.Module, input_shape: tuple[int, ...],
                   num_classes: int, modality: str, threat: ThreatModel, budget: str = "quick",
                   training: TrainingSpec | None = None, samples: int = 1
                   ) -> tuple[list[str], list[SkippedAttack]]:
    """The attack specs to run and the skipped ones with their reasons.

    `"auto"` considers every registered attack at the `budget` preset; an
    explicit list is taken as given, the preset filling only options it does
    not set. An attack is skipped when the threat model does not grant the
    knowledge it needs, when it does not handle the data's modality, or when
    the architecture lacks what it works on (`Attack.unsupported`); `"auto"` also skips an
    attack that would only repeat another on this client's `training` (`Attack.redundant_for`)."""
    automatic = isinstance(attacks, str) and attacks.strip().lower() == "auto"
    if isinstance(attacks, str):
        attacks = list(ATTACKS.names()) if automatic else [attacks]
    if not attacks:
        raise GradleakError("no attack given (use attacks='auto' for every applicable attack)")
    selected, skipped = [], []
    for item in attacks:
        spec = parse_spec(_component_text(item, "attack"), "attack")
        options = {**_budget_options(spec.name, budget), **spec.options}
        text = str(ComponentSpec(spec.name, options))
        attack = make_attack(text)
        reason = _why_not(attack, model, input_shape, num_classes, modality, threat)
        if not reason and automatic and training is not None:
            reason = attack.redundant_for(training, samples)
        if reason:
            skipped.append(SkippedAttack(text, reason))
        else:
            selected.append(text)
    return selected, skipped


def _why_not(attack: Attack, model, input_shape, num_classes, modality, threat: ThreatModel) -> str | None:
    """The one attack/threat/architecture compatibility check: the threat model's refusal, else
    the attack's own (`Attack.unsupported`: the modality, then the architecture)."""
    if modality not in attack.modalities:  # before the architecture: an override may not check it
        return threat.refuses(attack.needs()) or f"does not handle {modality} data"
    return threat.refuses(attack.needs()) or attack.unsupported(model, tuple(input_shape), num_classes, modality)


def _budget_options(name: str, budget: str) -> dict:
    return dict(getattr(ATTACKS.get(name), "budgets", {}).get(budget, {}))


def _check_budget(budget: str) -> None:
    if budget not in BUDGETS:
        raise GradleakError(f"unknown budget '{budget}'; choose from: {', '.join(BUDGETS)}")


def _component_text(item: Any, kind: str) -> str:
    """A `name:k=v` string for a spec string or an attack/defense object (its
    options that differ from the defaults)."""
    if isinstance(item, str):
        return str(parse_spec(item, kind))
    name = getattr(item, "name", None)
    if not name or not hasattr(item, "options"):
        raise GradleakError(f"a {kind} must be a 'name:key=value' string or a gradleak {kind} object, "
                            f"got {type(item).__name__}")
    options = item.options
    values: dict[str, Any] = {}
    if options is not None and dataclasses.is_dataclass(options):
        try:
            defaults = type(options)()  # type: ignore[misc]  # option dataclasses default every field
        except TypeError:
            defaults = None
        for f in dataclasses.fields(options):
            value = getattr(options, f.name)
            if defaults is None or value != getattr(defaults, f.name):
                values[f.name] = _format_option(value)
    return str(ComponentSpec(name, values))


def _format_option(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ";".join(_format_option(v) for v in value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def _check_update_fits(model: nn.Module, update: Update) -> None:
    from .fl.buffers import check_sent_buffers

    check_sent_buffers(model, update.buffers)
    params = dict(model.named_parameters())
    unknown = [n for n in update.tensors if n not in params]
    if unknown:
        raise GradleakError(f"update tensor '{unknown[0]}' is not a parameter of the model")
    for name, tensor in update.tensors.items():
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise GradleakError(f"update tensor '{name}' has shape {tuple(tensor.shape)}, "
                                f"the model's parameter {tuple(params[name].shape)}")


def _artifacts_folder(artifacts: str | Path | None, out: str | Path | None) -> Path:
    from .data.sources import cache_dir

    if artifacts is not None:
        return Path(artifacts)
    return Path(out) / "artifacts" if out is not None else cache_dir() / "artifacts"


def _run_with_progress(spec: AttackRunSpec, model, data, prior_loader, gallery, progress: bool,
                       artifacts: Path | None = None) -> AttackRunResult:
    if not progress:
        return run_scenario(spec, model, data, None, held_out=prior_loader, gallery=gallery, artifacts=artifacts)
    from .progress import attack_progress

    with attack_progress(spec.attack) as bar:
        return run_scenario(spec, model, data, bar, held_out=prior_loader, gallery=gallery, artifacts=artifacts)


def _attack_captured(spec: AttackRunSpec, attack: Attack, model: nn.Module, update: Update, data: Dataset,
                     threat: ThreatModel, training: TrainingSpec, gallery: Gallery | None,
                     artifacts: Path | None = None) -> AttackRunResult:
    start = time.perf_counter()
    device = pick_device(spec.device)
    x, y = data.inputs, data.labels
    sent = copy.deepcopy(model).to("cpu")
    # declared knowledge comes from the ground truth; an update with buffers gives its own (observe)
    bn = capture_bn_statistics(sent, x) if threat.declares("bn_statistics") else None
    obs = observe(update, sent, threat, input_shape=data.input_shape, num_classes=data.num_classes,
                  training=training, batch_size=update.samples, labels=y,
                  defenses=make_chain(spec.defenses).defenses,
                  modality=data.modality, bn_statistics=bn, tokenizer=data.tokenizer)
    return attack_observations(spec, attack, [(obs, x, y)], gallery, device, artifacts=artifacts, started=start)


def _defense_labels(defenses: tuple[str, ...]) -> dict:
    from .sweep import defense_label, strength_label

    return {"defense": defense_label(defenses), "strength": strength_label(defenses)}


def _model_digest(model: nn.Module) -> str:
    h = hashlib.sha256(type(model).__qualname__.encode())
    hash_weights(h, model)
    return h.hexdigest()[:16]


def _data_digest(data: Dataset) -> str:
    h = hashlib.sha256()
    h.update(data.inputs.detach().cpu().contiguous().numpy().tobytes())
    h.update(data.labels.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
