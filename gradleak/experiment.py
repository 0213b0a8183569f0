"""One attack scenario end to end:

data + model → fl client (with defenses) → Observation (threat model) →
attack.reconstruct → metrics (Hungarian-matched) → result.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .attacks import Attack, AttackContext, Reconstruction, make_attack
from .data import Dataset, DatasetSpec, load_dataset
from .defenses import DefenseChain, make_chain
from .errors import GradleakError
from .fl import TrainingSpec, aggregate_updates, compute_update
from .fl.training import check_bn_mode
from .metrics import score_batch, summarize
from .metrics.reidentify import Gallery
from .models import ModelSpec, build_model
from .options import (
    RUN_SPEC_BOUNDS,
    ComponentSpec,
    check_device,
    check_range,
    parse_spec,
    path_kind,
)
from .seeding import stream
from .threat import Observation, ThreatModel, capture_bn_statistics, expected_view, make_threat_model, observe


@dataclass(frozen=True)
class AttackRunSpec:
    """Everything that defines one attack scenario (and its result, given the seed)."""

    dataset: str
    model: str
    attack: str
    batch_size: int = 1
    defenses: tuple[str, ...] = ()
    images: int | None = None  # default: one batch
    local_steps: int = 1
    local_epochs: int | None = None
    local_batch_size: int | None = None
    bn_mode: str = "train"  # batch norm during local training: "train" (batch statistics) or "eval"
    optimizer: str = "sgd"  # the client's optimizer, `name[:k=v,...]` (gradleak.fl.training.OPTIMIZERS)
    shuffle_seed: int | None = None  # the client's shuffling DataLoader seed, known to the server (TrainingSpec)
    shuffle: str | None = None  # "none", "known" or "unknown" (TrainingSpec.order; default from shuffle_seed)
    augment: tuple[str, ...] = ()  # the client's data augmentation: "crop", "flip" (TrainingSpec)
    crop_padding: int = 4
    label_smoothing: float = 0.0
    clip_norm: float | None = None  # the client clips each step's gradient to this L2 norm
    # the client sends its buffers (batch-norm running statistics) with its update (TrainingSpec)
    sends_buffers: bool = False
    # the client fine-tunes LoRA adapters of this rank on the attention projections (TrainingSpec)
    lora: int | None = None
    lora_alpha: float | None = None
    lora_b_std: float = 0.0
    lr: float = 0.1
    seed: int = 0
    threat: str = "honest"
    knows: tuple[str, ...] = ()
    activation: str | None = None
    pretrain_steps: int = 0
    checkpoint: str | None = None
    split: str = "test"
    resize: int | None = None
    seq_len: int | None = None  # tokens per sequence of a text dataset (None: the dataset's default)
    lpips: str = "alex"
    device: str = "auto"
    # how many times the auditor may double an iterative attack's budget while its verdict is
    # undecided (see `climb`); 0: the attack runs once at its own budget
    doublings: int = 0

    def __post_init__(self):
        # value types, for specs that come from elsewhere (sweep files, the API)
        for name in ("dataset", "model", "attack", "threat", "bn_mode", "optimizer", "split", "lpips", "device"):
            if not isinstance(getattr(self, name), str):
                raise GradleakError(f"{name} must be a text, got {getattr(self, name)!r}")
        for name in ("activation", "checkpoint"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise GradleakError(f"{name} must be a text, got {getattr(self, name)!r}")
        if not isinstance(self.sends_buffers, bool):
            raise GradleakError(f"sends_buffers must be true or false, got {self.sends_buffers!r}")
        if self.shuffle is not None and not isinstance(self.shuffle, str):
            raise GradleakError(f"shuffle must be a text, got {self.shuffle!r}")
        for name in ("defenses", "knows", "augment"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise GradleakError(f"{name} must be a list of 'name:key=value' texts, got {value!r}")
        # the command line's bounds
        for name, bounds in RUN_SPEC_BOUNDS.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise GradleakError(f"--{name.replace('_', '-')} must be a number, got {value!r}")
            check_range(value, bounds, f"--{name.replace('_', '-')}")
        if self.lpips not in ("alex", "vgg", "none"):
            raise GradleakError(f"--lpips must be alex, vgg or none, got '{self.lpips}'")
        if self.split not in ("train", "test"):
            raise GradleakError(f"--split must be train or test, got '{self.split}'")
        check_bn_mode(self.bn_mode)
        self.training()  # the optimizer's name and options, checked once here

    def training(self) -> TrainingSpec:
        """The client's local training this spec declares."""
        return TrainingSpec(lr=self.lr, local_steps=self.local_steps, local_epochs=self.local_epochs,
                            local_batch_size=self.local_batch_size, batchnorm=self.bn_mode, optimizer=self.optimizer,
                            shuffle_seed=self.shuffle_seed, shuffle=self.shuffle,  # type: ignore[arg-type]
                            augment=self.augment, crop_padding=self.crop_padding,
                            label_smoothing=self.label_smoothing, clip_norm=self.clip_norm,
                            sends_buffers=self.sends_buffers, lora_rank=self.lora, lora_alpha=self.lora_alpha,
                            lora_b_std=self.lora_b_std)

    def to_dict(self) -> dict:
        return asdict(self)


def training_fields(training: TrainingSpec) -> dict:
    """The `AttackRunSpec` fields that declare `training` (the inverse of
    `AttackRunSpec.training`)."""
    return dict(lr=training.lr, local_steps=training.local_steps, local_epochs=training.local_epochs,
                local_batch_size=training.local_batch_size, bn_mode=training.batchnorm,
                optimizer=training.optimizer, shuffle_seed=training.shuffle_seed, shuffle=training.shuffle,
                augment=training.augment, crop_padding=training.crop_padding,
                label_smoothing=training.label_smoothing, clip_norm=training.clip_norm,
                sends_buffers=training.sends_buffers, lora=training.lora_rank, lora_alpha=training.lora_alpha,
                lora_b_std=training.lora_b_std)


@dataclass
class AttackRunResult:
    spec: AttackRunSpec
    metrics: dict
    per_image: list[dict]
    seconds: float
    originals: torch.Tensor
    reconstructions: torch.Tensor
    extras: dict = field(default_factory=dict)
    # converged / final_distance / trace as the attack reported them (None: not reported)
    convergence: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"AttackRunResult({self.summary()})"

    def summary(self) -> str:
        """The run in one line: what was attacked, and what the attack reached."""
        s, m = self.spec, self.metrics
        parts = [f"{s.attack} on {s.dataset}/{s.model}, batch {s.batch_size}, "
                 f"defenses {', '.join(s.defenses) or 'none'}, seed {s.seed}:"]
        scores = []
        if m.get("psnr") is not None:
            scores.append(f"PSNR {m['psnr']:.1f} dB, SSIM {m.get('ssim') or 0:.2f}")
        elif m.get("rouge1") is not None:
            scores.append(f"ROUGE-1 {m['rouge1']:.3f}, ROUGE-2 {m.get('rouge2') or 0:.3f}")
        elif m.get("mse") is not None:
            scores.append(f"MSE {m['mse']:.3g}")
        n = int(m.get("examples") or len(self.per_image))
        if m.get("reid") is not None:
            scores.append(f"re-identified {round(m['reid'] * n)} of {n} (chance {100 * m['reid_chance']:.2g}%)")
        if m.get("asr"):
            scores.append(f"copied {round(m['asr'] * n)} of {n}")
        ladder = self.extras.get("ladder") or {}
        if ladder:
            iterations = int(ladder.get("iterations") or 0)
            scores.append(f"{iterations:,} iterations, {ladder.get('decision')}" if iterations
                          else str(ladder.get("decision")))
        return " ".join(parts) + " " + "; ".join(scores)

    def to_json(self) -> dict:
        """The CLI's JSON contract."""
        s = self.spec
        return {
            "attack": s.attack,
            "defenses": list(s.defenses),
            "dataset": s.dataset,
            "model": s.model,
            "batch_size": s.batch_size,
            "n_images": len(self.per_image),
            "metrics": self.metrics,
            "seconds": self.seconds,
            "per_image": self.per_image,
            "convergence": {k: v for k, v in self.convergence.items() if not k.startswith("trace")},
            "spec": s.to_dict(),
            **({"extras": jsonable(self.extras)} if self.extras else {}),
        }


def pick_device(name: str = "auto") -> torch.device:
    """`auto` (a GPU when there is one), `cpu` or `cuda[:N]`; anything else is refused
    (by `gradleak.options.check_device`, the one device check)."""
    text = check_device(name)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(text)


# A bare path in place of a dataset name: a folder of images or a tensor file.
TENSOR_FILE_SUFFIXES = (".npz", ".safetensors", ".pt", ".pth")


def dataset_path_form(text: str) -> str | None:
    """The registered loader for a bare path (`data/client.npz`, `photos/`), or
    None when `text` is a dataset name."""
    head = text.strip()
    if not head or (":" in head and parse_spec(head, "dataset").name in _dataset_names()):
        return None
    if "/" not in head and "\\" not in head and not head.lower().endswith(TENSOR_FILE_SUFFIXES):
        return None
    if head.lower().endswith(TENSOR_FILE_SUFFIXES):
        return "tensors"
    return "image-folder"


def _dataset_names():
    from .data import DATASETS

    return DATASETS.names()


def dataset_spec(text: str, split: str, resize: int | None, seq_len: int | None = None) -> DatasetSpec:
    loader = dataset_path_form(text)
    if seq_len is not None and loader is not None:
        raise GradleakError("--seq-len applies to the text datasets (news, polarity), not to a file of inputs")
    if loader is not None:
        path = Path(text.strip()).expanduser()
        if path_kind(path, "dataset path") is None:
            raise GradleakError(f"dataset path '{path}' not found")
        return DatasetSpec(loader, split=split, resize=resize, path=str(path))
    spec = parse_spec(text, "dataset")
    opts = dict(spec.options)
    known = {"path", "resize", "crop", "channels", "tokenizer"}
    bad = [k for k in opts if k not in known]
    if bad:
        raise GradleakError(f"dataset option '{bad[0]}' unknown; valid: {', '.join(sorted(known))}")

    def as_int(key):
        if key not in opts:
            return None
        try:
            return int(opts[key])
        except ValueError:
            raise GradleakError(f"dataset option '{key}' must be an integer, got '{opts[key]}'") from None

    return DatasetSpec(spec.name, split=split, resize=resize if resize is not None else as_int("resize"),
                       crop=as_int("crop"), path=opts.get("path"), channels=as_int("channels"), seq_len=seq_len,
                       options={"tokenizer": opts["tokenizer"]} if "tokenizer" in opts else {})


def build_scenario_model(spec: AttackRunSpec, input_shape, num_classes, modality: str = "image"):
    return build_named_model(spec.model, input_shape, num_classes, spec.seed, spec.activation, modality)


def build_named_model(text: str, input_shape, num_classes: int, seed: int = 0,
                      activation: str | None = None, modality: str = "image") -> nn.Module:
    """A built-in model (`name[:k=v,...]`) or the user's own
    (`path/to/file.py:factory[:k=v,...]`, `package.module:factory[:k=v,...]`),
    seeded, checked to output at least one logit per class."""
    from .models.user import build_user_model, check_model_fits, is_user_model_ref

    if is_user_model_ref(text):
        if activation:
            raise GradleakError("--activation applies to built-in models only; set it in your own model")
        model = build_user_model(text, tuple(input_shape), num_classes, seed)
    else:
        model_spec = parse_spec(text, "model")
        options = dict(model_spec.options)
        activation = activation or options.pop("activation", None)
        model = build_model(ModelSpec(model_spec.name, tuple(input_shape), num_classes,
                                      activation=activation, seed=seed, options=options))
    check_model_fits(model, tuple(input_shape), num_classes, f"model '{text}'", modality)
    return model


def scenario_data(spec: AttackRunSpec, load: Callable[[DatasetSpec], Dataset] = load_dataset) -> Dataset:
    return load(dataset_spec(spec.dataset, spec.split, spec.resize, spec.seq_len))


def scenario_model(spec: AttackRunSpec, data: Dataset) -> nn.Module:
    """The attacked model as `run_attack` builds it, with its checkpoint (before pre-training)."""
    model = build_scenario_model(spec, data.input_shape, data.num_classes, data.modality)
    if spec.checkpoint:
        from .models.checkpoint import load_checkpoint
        load_checkpoint(model, spec.checkpoint)
    return model


def check_scenario(spec: AttackRunSpec, data: Dataset) -> tuple[Attack, DefenseChain, ThreatModel]:
    """The checks `run_scenario` makes before anything is computed: the attack, the defense
    chain and the threat model build, the threat model grants what the attack needs, the
    attack handles the data, and the data holds enough examples. Returns (attack, chain,
    threat model)."""
    attack_spec: ComponentSpec = parse_spec(spec.attack, "attack")
    attack = make_attack(attack_spec)
    chain = make_chain([parse_spec(d, "defense") for d in spec.defenses])
    # what the update will carry (batch-norm statistics in sent buffers) counts as seen
    threat = expected_view(make_threat_model(spec.threat, spec.knows), spec.training(), spec.batch_size,
                           chain.aggregate_clients)
    threat.check(attack_spec.name, attack.needs())
    if spec.lora is not None and not getattr(attack, "handles_lora", False):
        raise GradleakError(f"attack '{attack_spec.name}' cannot invert a LoRA client's update (--lora): it "
                            "holds only the adapters' tensors; use dager")
    if data.modality not in attack.modalities:
        raise GradleakError(f"attack '{attack_spec.name}' does not support {data.modality} data")
    needed = (spec.images or spec.batch_size) + (chain.aggregate_clients - 1) * spec.batch_size
    if needed > len(data):
        raise GradleakError(f"dataset '{data.name}' has {len(data)} examples, the scenario needs {needed}")
    return attack, chain, threat


def validate_run_spec(spec: AttackRunSpec, load: Callable[[DatasetSpec], Dataset], built: set) -> None:
    """Every check `run_attack` makes before it attacks — the dataset reference and its
    options, the model reference with its options, activation and checkpoint, a train split
    to pre-train on, and `check_scenario` — without running anything. `load` reads datasets
    (a caching loader serves a whole sweep); `built` holds the models already built."""
    data = scenario_data(spec, load)
    model_key = (spec.model, spec.activation, spec.checkpoint, spec.dataset, spec.split, spec.resize, spec.seq_len)
    if model_key not in built:
        scenario_model(spec, data)  # builds it: its options, activation and checkpoint are checked
        built.add(model_key)
    if spec.pretrain_steps:
        pretraining_data(spec, load)
    check_scenario(spec, data)


def run_attack(spec: AttackRunSpec, progress: Callable[[int, int, float], None] | None = None,
               artifacts: Path | None = None) -> AttackRunResult:
    """Run one scenario named by registry names (or user references). Deterministic given `spec.seed`.
    `artifacts`: the study's folder for what attacks train once and reuse (`AttackContext.artifacts`)."""
    data = scenario_data(spec)
    model = scenario_model(spec, data)
    if spec.pretrain_steps:
        model = _pretrained(model, spec)
    return run_scenario(spec, model, data, progress,
                        held_out=lambda targets: prior_data(spec.dataset, spec.split, spec.resize, data, targets,
                                                            spec.seq_len),
                        gallery=lambda targets: gallery_for(spec.dataset, spec.split, spec.resize, data, targets,
                                                            spec.seq_len),
                        artifacts=artifacts)


def run_scenario(spec: AttackRunSpec, model: nn.Module, data: Dataset,
                 progress: Callable[[int, int, float], None] | None = None,
                 held_out: Callable[[torch.Tensor], Any] | None = None,
                 gallery: Callable[[torch.Tensor], Gallery | None] | None = None,
                 artifacts: Path | None = None) -> AttackRunResult:
    """Attack the built `model` on `data` as `spec` describes (its dataset and
    model fields only label the result). The one path behind the CLI, sweeps
    and `gradleak.audit`. `model` is not modified; `held_out(targets)` gives
    held-out examples when the threat model grants them (default: every
    example of `data` that is not a target); `gallery(targets)` the examples the
    auditor re-identifies reconstructions among (default: up to GALLERY_SIZE
    non-target examples of `data`); `artifacts` the folder where attacks keep what they
    train once per setting (None: nothing is kept). An iterative attack climbs its budget
    ladder (`climb`) up to `spec.doublings` doublings."""
    start = time.perf_counter()
    device = pick_device(spec.device)
    attack, chain, threat = check_scenario(spec, data)
    training = spec.training()
    n_images = spec.images or spec.batch_size
    others = chain.aggregate_clients - 1

    # the model the client trains (LoRA adapters added here), the one every attack observes
    model = training.prepare_model(chain.transform_model(copy.deepcopy(model)), spec.seed)
    warn_if_output_ignores_input(model, data.inputs)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(spec.seed))
    targets = order[:n_images]
    pool = order[n_images:]
    prior = None
    if "prior_data" in threat.grants:
        prior = held_out(targets) if held_out is not None else _held_out(data, targets)
    ctx = AttackContext(seed=spec.seed, device=device, progress=progress, prior_data=prior, artifacts=artifacts)
    judge = gallery(targets) if gallery is not None else gallery_from(data, targets, f"examples of {data.name}")
    server_secrets = None
    if attack.malicious:
        prepared = attack.prepare_model(model, data.input_shape, data.num_classes, ctx)
        model, server_secrets = prepared.model, prepared.secrets
    model = model.to("cpu")

    scores, originals, recons, iterations, extras, runs, ladders = [], [], [], [], {}, [], []
    n_batches = math.ceil(n_images / spec.batch_size)
    for b in range(n_batches):
        idx = targets[b * spec.batch_size:(b + 1) * spec.batch_size]
        x, y = data.inputs[idx], data.labels[idx]
        # Each client's defense randomness is its own stream: clients summed by secure
        # aggregation must not share a noise draw.
        update = compute_update(model, x, y, training, chain, stream(spec.seed, "client", "target", b))
        batch_total = x.shape[0]
        if others:
            updates = [update]
            for k in range(others):
                oidx = pool[(b * others + k) * spec.batch_size:(b * others + k + 1) * spec.batch_size]
                updates.append(compute_update(model, data.inputs[oidx], data.labels[oidx], training,
                                              chain, stream(spec.seed, "client", "other", b, k)))
            update = aggregate_updates(updates)
            batch_total = update.samples
        bn = capture_bn_statistics(model, x) if threat.declares("bn_statistics") else None
        obs = observe(update, copy.deepcopy(model), threat, input_shape=data.input_shape,
                      num_classes=data.num_classes, training=training, batch_size=batch_total,
                      labels=y, defenses=chain.defenses, modality=data.modality, tokenizer=data.tokenizer,
                      bn_statistics=bn, prior_data=prior, server_secrets=server_secrets)
        batch_ctx = AttackContext(seed=batch_attack_seed(spec.seed, b), device=device, progress=progress,
                                  artifacts=artifacts)
        rec, batch_scores, aligned, ladder = climb(attack, obs, x, y, batch_ctx, spec.lpips, judge, spec.doublings)
        ladders.append(ladder)
        for s in batch_scores:
            s.index += b * spec.batch_size
        scores += batch_scores
        originals.append(x)
        recons.append(aligned)
        iterations.append(rec.iterations)
        runs.append(rec)
        for key, value in rec.extras.items():
            extras.setdefault(key, []).append(value)

    metrics = summarize(scores)
    metrics["iterations"] = float(sum(iterations) / len(iterations))
    extras["ladder"] = ladder_summary(ladders, judge)
    return AttackRunResult(spec, metrics, [s.to_dict() for s in scores], time.perf_counter() - start,
                           torch.cat(originals), torch.cat(recons), extras, convergence_summary(runs))


BLIND_CHECK_EXAMPLES = 8
BLIND_MODEL_MESSAGE = ("the model gives the same output for every input (a collapsed or dead model, e.g. from "
                       "pre-training that diverged): its update says nothing about the data, so every attack "
                       "fails here whatever the defense; audit a model that classifies its inputs")


def warn_if_output_ignores_input(model: nn.Module, inputs: torch.Tensor) -> None:
    """Warn (once per message, as warnings do) when `model` gives the same output for the
    first few of `inputs`: a failed attack on such a model says nothing about a defense."""
    if output_ignores_input(model, inputs[:BLIND_CHECK_EXAMPLES]):
        warnings.warn(BLIND_MODEL_MESSAGE, stacklevel=3)


def output_ignores_input(model: nn.Module, inputs: torch.Tensor, tolerance: float = 1e-4) -> bool:
    """True when `model` maps every one of several different inputs to the same output
    (up to `tolerance` of the output's scale): nothing downstream can depend on the data."""
    if inputs.shape[0] < 2 or bool((inputs == inputs[:1]).all()):
        return False
    device = next(model.parameters(), inputs).device
    modes = [m.training for m in model.modules()]
    model.eval()  # batch norm must not mix the examples, nor update its running statistics
    try:
        with torch.no_grad():
            out = model(inputs.to(device)).flatten(1).double()
    finally:
        for module, mode in zip(model.modules(), modes):
            module.training = mode
    spread = float((out - out[:1]).abs().max())
    return spread <= tolerance * max(float(out.abs().max()), 1e-12)


def batch_attack_seed(seed: int, batch: int) -> int:
    """The attack's own seed (initialisation, restarts) for batch `batch` of a run."""
    return seed * 7919 + batch


# --------------------------------------------------------------------------- the budget ladder
# The auditor holds the ground truth, so it can see whether more budget would change a
# verdict: an iterative attack is scored at its own budget and after each doubling of it
# (resuming, not restarting), and stops climbing once its verdict is decided.

# A doubling that raised the batch's PSNR (of its mean MSE; for other data the same dB of
# MSE) by at most this much, and re-identified no more examples, leaves the attack saturated.
SATURATION_MARGIN_DB = 0.5
# the same for token sequences, on the batch's mean ROUGE-1 (a word in 50 of the batch's)
SATURATION_MARGIN_ROUGE = 0.02
# The doublings sweeps, `gradleak.audit` and the Flower audit allow an attack by default.
LADDER_DOUBLINGS = 3


@dataclass
class Rung:
    """One rung of an attack's budget ladder, scored by the auditor."""

    iterations: int  # the attack's own count (all restarts together)
    budget: int | None  # iterations per restart this rung allowed
    seconds: float
    mse: float | None  # None for token sequences, which have no MSE
    psnr: float | None
    examples: int
    copies: int  # examples reconstructed exactly (ASR's criterion)
    identified: int | None  # examples re-identified among the gallery (None: no gallery)
    rouge1: float | None = None  # token sequences: mean ROUGE-1 (None for other data)

    def to_dict(self) -> dict:
        return asdict(self)


def climb(attack: Attack, obs: Observation, x: torch.Tensor, y: torch.Tensor, ctx: AttackContext,
          lpips: str, gallery: Gallery | None, doublings: int):
    """Attack one observation up the budget ladder: score each rung against (x, y) and stop
    at the first rung whose verdict is decided (`rung_decision`) or after `doublings`
    doublings. Returns the last rung's (Reconstruction, scores, aligned reconstructions) and
    the ladder: its rungs and how it ended."""
    started = time.perf_counter()
    rungs: list[Rung] = []
    chance = None
    decision = None
    first = attack.budget()
    blind = attack.blind_to(obs.training) if obs.knows("local_training") else None
    for index, rec in enumerate(attack.rungs(obs, ctx)):
        if blind:
            rec.extras["training_blind"] = blind
        broken = int((~torch.isfinite(rec.inputs.detach().flatten(1)).all(1)).sum()) if rec.inputs.numel() else 0
        if broken:
            rec.extras["not_finite"] = (f"{broken} of {len(rec.inputs)} reconstruction(s) held NaN or infinite "
                                        "values: scored as not reconstructed")
        scores, aligned = score_batch(x, y, rec.inputs, rec.labels, obs.modality, lpips, gallery=gallery,
                                      tokenizer=obs.tokenizer)
        chance = scores[0].reid_chance if scores else None
        budget = first * 2 ** index if first else None
        rungs.append(rung_of(rec, scores, budget, time.perf_counter() - started))
        analytic = not attack.iterative and not rec.trace
        decision = rung_decision(rungs, analytic, rec.converged, chance, attack.saturation_floor())
        if decision is not None or index >= doublings:
            break
    return rec, scores, aligned, {"rungs": [r.to_dict() for r in rungs], "decision": decision or "undecided",
                                  "saturated": decision is not None and decision != "leak",
                                  "reid_chance": chance}


def rung_of(rec: Reconstruction, scores: list, budget: int | None, seconds: float) -> Rung:
    from .metrics.image import psnr_from_mse

    errors = [getattr(s, "mse", None) for s in scores]
    mse = sum(errors) / len(errors) if errors and None not in errors else None
    judged = [s for s in scores if s.gallery_rank is not None]
    rouge1 = [getattr(s, "rouge1", None) for s in scores]
    return Rung(iterations=int(rec.iterations), budget=budget, seconds=round(seconds, 3), mse=mse,
                psnr=psnr_from_mse(mse) if mse is not None and getattr(scores[0], "psnr", None) is not None else None,
                examples=len(scores), copies=sum(bool(s.success) for s in scores),
                identified=sum(bool(s.identified) for s in judged) if judged else None,
                rouge1=sum(rouge1) / len(rouge1) if rouge1 and None not in rouge1 else None)


def rung_decision(rungs: list[Rung], analytic: bool, converged: bool | None, chance: float | None,
                  floor: int = 1) -> str | None:
    """How the ladder ends at its last rung, or None while undecided:
    'leak' — some example copied, or more re-identified than chance gives (its interval);
    'analytic' — an attack whose result more budget cannot change;
    'stop rule' — the attack met its own stop rule (CPL's distance threshold);
    'saturated' — the last doubling raised neither PSNR by more than SATURATION_MARGIN_DB
    (for token sequences: the copies, nor ROUGE-1 by more than SATURATION_MARGIN_ROUGE) nor
    the number re-identified, at a budget of at least `floor` iterations (the attack's
    `saturation_floor`). One rung of an iterative attack is never saturated."""
    from .stats import above_chance

    last = rungs[-1]
    if last.copies or (last.identified is not None and chance is not None
                       and above_chance(last.identified, last.examples, chance)):
        return "leak"
    if analytic:
        return "analytic"
    if converged:
        return "stop rule"
    if len(rungs) < 2 or (last.budget or 0) < floor:
        return None
    before = rungs[-2]
    more_identified = (last.identified or 0) > (before.identified or 0)
    if last.mse is None or before.mse is None:  # token sequences: copies, ROUGE-1 and re-identification
        gained = (last.copies > before.copies or more_identified
                  or (last.rouge1 or 0.0) - (before.rouge1 or 0.0) > SATURATION_MARGIN_ROUGE)
        return None if gained else "saturated"
    gain_db = 10 * math.log10(max(before.mse, 1e-12) / max(last.mse, 1e-12))
    return "saturated" if gain_db <= SATURATION_MARGIN_DB and not more_identified else None


def ladder_summary(ladders: list[dict], gallery: Gallery | None) -> dict:
    """A run's ladders (one per attacked batch) as the store keeps them: saturated when every
    batch's attack saturated (a leak decides the verdict without it)."""
    decisions = [ladder["decision"] for ladder in ladders]
    return {"batches": ladders, "decision": "leak" if "leak" in decisions else
            ("undecided" if "undecided" in decisions else decisions[0] if decisions else "undecided"),
            "saturated": bool(ladders) and all(ladder["saturated"] for ladder in ladders),
            # the budget per restart the ladders ended at (the attack's own count when it has none)
            "iterations": max((ladder["rungs"][-1]["budget"] or ladder["rungs"][-1]["iterations"]
                               for ladder in ladders if ladder["rungs"]), default=0),
            "gallery": gallery.describe() if gallery is not None else None}


def convergence_summary(runs: list[Reconstruction]) -> dict:
    """Whether every batch's attack reported convergence, its final matching distance, its
    trace, and whether its matching distance was still falling at the end (the attacker's
    own view; the auditor's judgement of saturation is the ladder's, see `climb`)."""
    flags = [r.converged for r in runs if r.converged is not None]
    distances = [r.final_distance for r in runs if r.final_distance is not None]
    improving = [still_improving(r.trace) for r in runs]
    converged = all(flags) if flags else None
    return {"converged": converged,
            "final_distance": max(distances) if distances else None,
            "still_improving": any(v for v in improving if v is not None) if any(
                v is not None for v in improving) else None,
            "trace": [list(r.trace) for r in runs] if any(r.trace for r in runs) else [],
            "trace_iterations": [list(r.trace_iterations) for r in runs] if any(r.trace_iterations for r in runs)
            else [],
            "trace_seconds": [list(r.trace_seconds) for r in runs] if any(r.trace_seconds for r in runs) else []}


# The last tenth of an attack's iterations counts as "still improving" when it found a
# matching distance this much (relatively) below the best of the iterations before it.
IMPROVING_TAIL = 0.1
IMPROVING_GAIN = 0.01


def still_improving(trace: list[float], tail: float = IMPROVING_TAIL, gain: float = IMPROVING_GAIN
                    ) -> bool | None:
    """Whether an iterative attack was still lowering its matching distance when its
    budget ran out (None for a trace too short to tell, e.g. an analytic attack)."""
    values = [v for v in trace if math.isfinite(v)]
    if len(values) < 10:
        return None
    cut = max(1, int(len(values) * (1 - tail)))
    before, last = min(values[:cut]), min(values[cut:])
    return last < before * (1 - gain) if before > 0 else False


# Re-identification compares each reconstruction with this many other examples when the
# data has them (Gallery, gradleak.metrics.reidentify).
GALLERY_SIZE = 1000


def gallery_from(data: Dataset, exclude: torch.Tensor | None, source: str, note: str | None = None,
                 size: int = GALLERY_SIZE) -> Gallery:
    """Up to `size` examples of `data` other than `exclude`, the same ones for every seed (a
    fixed draw), described as `source`."""
    keep = torch.ones(len(data), dtype=torch.bool)
    if exclude is not None:
        keep[exclude] = False
    pool = keep.nonzero().flatten()
    order = torch.randperm(len(pool), generator=stream(0, "gallery"))
    chosen = pool[order[:size]].sort().values
    if len(chosen) < size and note is None:
        note = f"all the dataset has{' besides the attacked examples' if exclude is not None else ''}"
    return Gallery(data.inputs[chosen], source, note)


def gallery_for(dataset: str, split: str, resize: int | None, data: Dataset, targets: torch.Tensor,
                seq_len: int | None = None) -> Gallery:
    """The re-identification gallery of a scenario: GALLERY_SIZE examples of the named
    dataset's other split (the same for every seed, attack and defense of a study), or
    the examples of a sample set or user file that were not attacked."""
    from .data import TAKES_PATH

    if data.samples_only or dataset_path_form(dataset) is not None or \
            parse_spec(dataset, "dataset").name in TAKES_PATH:  # a file's examples: its other split may be itself
        return gallery_from(data, targets, f"other examples of {data.name}")
    return _split_gallery(dataset, "train" if split == "test" else "test", resize, seq_len)


@functools.lru_cache(maxsize=4)
def _split_gallery(dataset: str, split: str, resize: int | None, seq_len: int | None = None) -> Gallery:
    # one per process and study: its perceptual features are computed once, then reused
    other = load_dataset(dataset_spec(dataset, split, resize, seq_len))
    return gallery_from(other, None, f"{split}-split examples of {other.name}")


def _held_out(data: Dataset, targets: torch.Tensor) -> Dataset:
    mask = torch.ones(len(data), dtype=torch.bool)
    mask[targets] = False
    return data.subset(mask.nonzero().flatten())


def pretraining_data(spec: AttackRunSpec, load: Callable[[DatasetSpec], Dataset] = load_dataset) -> Dataset:
    """The train split `--pretrain-steps` trains on; refused for a set of sample images."""
    train = load(dataset_spec(spec.dataset, "train", spec.resize, spec.seq_len))
    if train.samples_only:
        raise GradleakError(f"dataset '{train.name}' ships only sample images; it cannot pre-train a model "
                            "(use --checkpoint, or pre-train on mnist/fashion-mnist)")
    return train


def _pretrained(model, spec: AttackRunSpec):
    from .models.training import pretrain

    pretrain(model, pretraining_data(spec), steps=spec.pretrain_steps, seed=spec.seed)
    return model


def prior_data(dataset: str, split: str, resize: int | None, data: Dataset, targets: torch.Tensor,
               seq_len: int | None = None) -> Dataset:
    """Held-out examples for attacks that may use the data distribution: the
    other split of a named dataset, or the non-target examples of a sample set."""
    if data.samples_only:
        return _held_out(data, targets)
    other = "train" if split == "test" else "test"
    return load_dataset(dataset_spec(dataset, other, resize, seq_len))


def result_record(result: AttackRunResult, images: bool = True) -> dict:
    """A picklable, JSON-shaped record of one result for the results store:
    metrics, extras (with the attack's convergence report and the auditor's ladder),
    the comparison grid and every image pair as PNG bytes (`images=False`: none). Token
    sequences keep their numeric scores per example and each original beside its recovery
    as text in `extras["sequences"]`."""
    import io

    from .viz import image_grid

    def png(image) -> bytes:
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue()

    pictures = images
    images, grid = [], None
    if result.originals.dim() == 4 and pictures:
        grid = png(image_grid([result.originals, result.reconstructions]))
        for i, score in enumerate(result.per_image):
            images.append({"idx": i, "metrics": score,
                           "original": png(image_grid([result.originals[i:i + 1]], pad=0)),
                           "reconstruction": png(image_grid([result.reconstructions[i:i + 1]], pad=0))})
    else:
        images = [{"idx": i, "metrics": _numeric(s), "original": None, "reconstruction": None}
                  for i, s in enumerate(result.per_image)]
    extras = jsonable(result.extras)
    if result.per_image and "recovered" in result.per_image[0]:
        extras["sequences"] = [{"index": s["index"], "original": s.get("original", ""),
                                "recovered": s.get("recovered", ""), "exact": bool(s.get("success"))}
                               for s in result.per_image]
    if result.convergence:
        extras["convergence"] = jsonable(result.convergence)
    return {"metrics": result.metrics, "extras": extras, "seconds": result.seconds,
            "grid_png": grid, "images": images}


def _numeric(score: dict) -> dict:
    """The numbers of one example's score (a language model's per-position labels and the
    decoded texts are kept elsewhere)."""
    return {k: v for k, v in score.items() if v is None or isinstance(v, (int, float))}


def write_outputs(result: AttackRunResult, out: str | Path) -> dict[str, Path]:
    """result.json and, for images, grid.png in `out` (for token sequences, sequences.txt:
    each original beside its recovery), each written atomically."""
    from .viz import save_grid

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "result.json"}
    _write_atomically(paths["json"], json.dumps(result.to_json(), indent=2))
    if result.originals.dim() == 4:
        paths["grid"] = out / "grid.png"
        save_grid(paths["grid"], result.originals, result.reconstructions)
    elif result.per_image and "recovered" in result.per_image[0]:
        paths["sequences"] = out / "sequences.txt"
        _write_atomically(paths["sequences"], sequence_pairs_text(result.per_image))
    return paths


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def sequence_pairs_text(per_example: list[dict]) -> str:
    """Each attacked sequence and what the attack recovered for it, as plain text."""
    blocks = []
    for score in per_example:
        verdict = "exact" if score.get("success") else f"ROUGE-1 {score.get('rouge1', 0.0):.3f}"
        blocks.append(f"#{score['index']} ({verdict})\noriginal:  {score.get('original', '')}\n"
                      f"recovered: {score.get('recovered', '')}\n")
    return "\n".join(blocks)


def jsonable(value):
    """JSON-safe copy: tensors become lists, anything else unknown its text."""
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
