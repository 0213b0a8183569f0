"""`audit`: attack a simulated client that trains the user's model on the user's data, with
the defenses applied where a real client applies them, over one or more seeds, adding fresh
examples while a verdict is still open (the sample ladder)."""
from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from torch import nn

from ..attacks import Attack
from ..attacks.base import AttackRefused
from ..data.base import data_digest
from ..data.references import resolve_data, run_order
from ..defenses import make_chain
from ..errors import GradleakError
from ..fl import TrainingSpec
from ..leakage import parse_tolerance
from ..metrics.reidentify import Gallery
from ..models.base import model_digest
from ..models.references import parse_model_reference, resolve_model
from ..progress import attack_progress
from ..run.experiment import run_scenario
from ..run.scenario.assembly import check_enough_examples, check_whole_batches
from ..run.scenario.gallery import GALLERY_SIZE, resolved_gallery, with_extra
from ..run.scenario.spec import AttackRunResult, AttackRunSpec, training_fields
from ..sweep.sample_plan import examples_per_run, rung_seed, setting_target
from ..threat import expected_view, make_threat_model
from .inputs import artifacts_folder, audit_seeds, gallery_inputs
from .result import AuditResult
from .selection import BUDGET_DOUBLINGS, SkippedAttack, check_budget, component_text, select_attacks
from .setting import Setting


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
             re-identified among them and the examples of `data` that were not attacked,
             and linked among those of their own class (inputs given alone: every class's).
    tolerance: what you accept (`gradleak.leakage.Tolerance`, a mapping, or
             `"linkage=0.6,recognizable=0.1"`): `holds` means every saturated attack's linkage
             AUC and recognizable rate are bounded within it at 95%.
    sample_rungs, max_examples: while a verdict is still open (too few examples to bound the
             rates), up to `sample_rungs` more rounds attack more examples of `data` (new seeds,
             each drawing its own examples, which may repeat ones drawn before when `data` is
             small), until each attack was judged on `max_examples`. Default 0: none are added,
             and an open verdict says how many examples would bound the rates (or pass `images`,
             whole batches of `batch_size`: each attacked client holds one batch; the ladder's
             runs also take whole batches, at most as many as `data` holds).
    out:     when given, the store and the HTML report are written there.
    artifacts: the folder where attacks keep what they train once per setting (the learned
             inverters), so that later calls with the same model, defenses and training reuse
             it; default `out`/artifacts, else $GRADLEAK_CACHE/artifacts (~/.cache/gradleak).
    """
    start = time.perf_counter()
    kept = artifacts_folder(artifacts, out)
    training = training or TrainingSpec(lr=lr, local_steps=local_steps, local_epochs=local_epochs,
                                        local_batch_size=local_batch_size, batchnorm=bn_mode, optimizer=optimizer,
                                        shuffle_seed=shuffle_seed, sends_buffers=sends_buffers)
    check_budget(budget)
    seeds = audit_seeds(seed)
    tolerance = parse_tolerance(tolerance)
    if not isinstance(sample_rungs, int) or isinstance(sample_rungs, bool) or not 0 <= sample_rungs <= 10:
        raise GradleakError(f"sample_rungs must be an integer from 0 to 10, got {sample_rungs!r}")
    if not isinstance(max_examples, int) or isinstance(max_examples, bool) or max_examples < 1:
        raise GradleakError(f"max_examples must be a positive integer, got {max_examples!r}")
    if images is not None and (not isinstance(images, int) or isinstance(images, bool) or images < 1):
        raise GradleakError(f"images must be a positive integer, got {images!r}")
    check_whole_batches(images, batch_size)
    threat_model = make_threat_model(threat, tuple(knows))
    # the one resolve boundary: the references are parsed and loaded here (data/references,
    # models/references), and from here on only objects flow down
    resolved = resolve_data(data, split, resize, seq_len)
    dataset = resolved.dataset
    reference = parse_model_reference(model) if isinstance(model, str) else model
    extra_gallery = gallery_inputs(gallery, dataset) if gallery is not None else None
    defense_texts = tuple(component_text(d, "defense") for d in defenses)
    clients = make_chain(defense_texts).aggregate_clients
    expected = expected_view(threat_model, training, batch_size, clients)
    # too few examples is a fact about the data, not about one attack: one line before any run
    check_enough_examples(len(dataset), dataset.name, images, batch_size, clients)
    runs: list[AttackRunResult] = []
    skipped: list[SkippedAttack] = []

    def judge(run_seed: int, examples: int | None) -> Gallery:
        # drawn from the resolved data with the run's own targets, before the run checks the attack
        targets = run_order(len(resolved.dataset), run_seed)[:examples or batch_size]
        return with_extra(resolved_gallery(resolved.gallery_split, resolved.gallery_draw(targets, GALLERY_SIZE)),
                          extra_gallery)

    def attack_seed(run_seed: int, examples: int | None, only: frozenset[str] | None = None) -> tuple[nn.Module, str]:
        nonlocal dataset
        built, model_label, dataset = resolve_model(reference, resolved.dataset, run_seed, checkpoint)
        gallery_of_seed = judge(run_seed, examples)
        # the architecture is checked where every run checks it (check_scenario: AttackRefused)
        selected, not_run = select_attacks(attacks, None, dataset.input_shape, dataset.num_classes,
                                           dataset.modality, expected, budget, training, batch_size)
        if run_seed == seeds[0]:
            skipped.extend(not_run)
        base = AttackRunSpec(dataset=resolved.label, model=model_label, attack="ig", batch_size=batch_size,
                             defenses=defense_texts, images=examples, **training_fields(training),
                             seed=run_seed, threat=threat,
                             knows=tuple(knows), seq_len=seq_len, lpips=lpips, device=device,
                             doublings=BUDGET_DOUBLINGS[budget])
        for text in selected:
            if only is not None and text not in only:  # both canonical (select_attacks, the stored specs)
                continue
            spec = dataclasses.replace(base, attack=text)
            try:
                with attack_progress(spec.attack) if progress else contextlib.nullcontext() as bar:
                    runs.append(run_scenario(spec, built, dataset, bar, gallery=gallery_of_seed, artifacts=kept,
                                             held_out=resolved.prior if resolved.spec is not None else None))
            except AttackRefused as exc:
                if run_seed == seeds[0]:
                    skipped.append(SkippedAttack(text, exc.reason))
            except GradleakError as exc:
                if run_seed == seeds[0]:
                    skipped.append(SkippedAttack(text, str(exc)))
        return built, model_label

    for run_seed in seeds:
        built, model_label = attack_seed(run_seed, images)
    for rung in range(1, sample_rungs + 1):
        # the sample ladder: fresh examples (new seeds) while the verdict is still open
        plan = setting_target(AuditResult(runs, skipped, {}, tolerance=tolerance).verdicts(), max_examples,
                              last=rung == sample_rungs)
        if plan is None or len(dataset) < batch_size:
            break
        # plan.attacks: those the open verdicts name (gradleak.analysis.verdict: the one nearest
        # to showing a leak beyond the tolerance), or None: all of them
        per_seed = min(len(dataset) // batch_size * batch_size, examples_per_run(plan.missing, len(seeds), batch_size))
        for run_seed in seeds:
            attack_seed(rung_seed(run_seed, rung), per_seed, plan.attacks)
    setting = Setting(dataset=resolved.label, model=model_label, model_digest=model_digest(built),
                      data_digest=data_digest(dataset), batch_size=batch_size, training=training, seed=seeds[0],
                      seeds=tuple(seeds), threat=threat_model.name, budget=budget, defenses=tuple(defense_texts),
                      seconds=time.perf_counter() - start)
    result = AuditResult(runs, skipped, setting.as_dict(), tolerance=tolerance)
    if out is not None:
        result.write_report(out)
    return result
