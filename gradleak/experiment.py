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
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .attacks import Attack, AttackContext, make_attack
from .data import Dataset, DatasetSpec, load_dataset
from .data.references import dataset_path_form, dataset_spec, held_out_examples, prior_data
from .defenses import DefenseChain, make_chain
from .errors import GradleakError
from .fl import TrainingSpec, aggregate_updates, compute_update
from .fl.training import check_bn_mode, scenario_fields, training_from_scenario
from .ladder import climb_budget_ladder, convergence_summary, ladder_summary
from .metrics import summarize
from .metrics.reidentify import Gallery
from .models.references import build_named_model
from .options import (
    RUN_SPEC_BOUNDS,
    ComponentSpec,
    check_device,
    check_range,
    parse_spec,
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
    # undecided (gradleak.ladder); 0: the attack runs once at its own budget
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
        return training_from_scenario(self)

    def to_dict(self) -> dict:
        return asdict(self)


def training_fields(training: TrainingSpec) -> dict:
    """The `AttackRunSpec` fields that declare `training` (the inverse of
    `AttackRunSpec.training`)."""
    return scenario_fields(training)


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
            # the attack's seconds and the auditor's seconds judging it (scores, gallery), apart
            "attack_seconds": (self.extras.get("ladder") or {}).get("attack_seconds"),
            "judge_seconds": (self.extras.get("ladder") or {}).get("judge_seconds"),
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


def build_scenario_model(spec: AttackRunSpec, input_shape, num_classes, modality: str = "image"):
    return build_named_model(spec.model, input_shape, num_classes, spec.seed, spec.activation, modality)


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
    ladder (gradleak.ladder) up to `spec.doublings` doublings."""
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
        prior = held_out(targets) if held_out is not None else held_out_examples(data, targets)
    ctx = AttackContext(seed=spec.seed, device=device, progress=progress, prior_data=prior, artifacts=artifacts)
    judge = gallery(targets) if gallery is not None else gallery_from(data, targets, f"examples of {data.name}")
    server_secrets = None
    if attack.malicious:
        prepared = attack.prepare_model(model, data.input_shape, data.num_classes, ctx)
        model, server_secrets = prepared.model, prepared.secrets
    model = model.to("cpu")

    def batches():
        for b in range(math.ceil(n_images / spec.batch_size)):
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
            yield obs, x, y

    return attack_observations(spec, attack, batches(), judge, device, progress, artifacts, start)


def attack_observations(spec: AttackRunSpec, attack: Attack, batches: Iterable[tuple[Observation, torch.Tensor,
                                                                                     torch.Tensor]],
                        gallery: Gallery | None, device: torch.device,
                        progress: Callable[[int, int, float], None] | None = None, artifacts: Path | None = None,
                        started: float | None = None) -> AttackRunResult:
    """The one run pipeline: attack each observed update (simulated by `run_scenario` or captured
    from a real client, `gradleak.api.audit_update`) up its budget ladder, score it against the
    batch it came from, and gather the result. `batches` yields (observation, inputs, labels)."""
    start = time.perf_counter() if started is None else started
    scores, originals, recons, iterations, extras, runs, ladders = [], [], [], [], {}, [], []
    for b, (obs, x, y) in enumerate(batches):
        batch_ctx = AttackContext(seed=batch_attack_seed(spec.seed, b), device=device, progress=progress,
                                  artifacts=artifacts)
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
        for key, value in rec.extras.items():
            extras.setdefault(key, []).append(value)

    metrics = summarize(scores)
    metrics["iterations"] = float(sum(iterations) / len(iterations))
    extras["ladder"] = ladder_summary(ladders, gallery)
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
            images.append({"idx": i, "metrics": _numeric(score),
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
    """The numbers of one example's score, as the store keeps them: a mapping of numbers (the
    rank under each distance) flattened to `gallery_ranks.ssim`-style keys; a language model's
    per-position labels and the decoded texts are kept elsewhere."""
    out = {}
    for k, v in score.items():
        if isinstance(v, dict):
            out.update({f"{k}.{name}": n for name, n in v.items() if n is None or isinstance(n, (int, float))})
        elif v is None or isinstance(v, (int, float)):
            out[k] = v
    return out


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
