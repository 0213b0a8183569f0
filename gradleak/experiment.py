"""One attack scenario end to end:

data + model → fl client (with defenses) → Observation (threat model) →
attack.reconstruct → metrics (Hungarian-matched) → result.
"""
from __future__ import annotations

import copy
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
from .defenses import make_chain
from .errors import GradleakError
from .fl import TrainingSpec, aggregate_updates, compute_update
from .fl.training import check_bn_mode
from .metrics import score_batch, summarize
from .models import ModelSpec, build_model
from .options import (
    RUN_SPEC_BOUNDS,
    ComponentSpec,
    check_device,
    check_range,
    parse_spec,
)
from .seeding import stream
from .threat import Observation, capture_bn_statistics, make_threat_model, observe


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
    lr: float = 0.1
    seed: int = 0
    threat: str = "honest"
    knows: tuple[str, ...] = ()
    activation: str | None = None
    pretrain_steps: int = 0
    checkpoint: str | None = None
    split: str = "test"
    resize: int | None = None
    lpips: str = "alex"
    device: str = "auto"

    def __post_init__(self):
        # the command line's bounds, for specs that come from elsewhere (sweep files, the API)
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

    def to_dict(self) -> dict:
        return asdict(self)


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


def dataset_spec(text: str, split: str, resize: int | None) -> DatasetSpec:
    loader = dataset_path_form(text)
    if loader is not None:
        path = Path(text.strip()).expanduser()
        if not path.exists():
            raise GradleakError(f"dataset path '{path}' not found")
        return DatasetSpec(loader, split=split, resize=resize, path=str(path))
    spec = parse_spec(text, "dataset")
    opts = dict(spec.options)
    known = {"path", "resize", "crop", "channels"}
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
                       crop=as_int("crop"), path=opts.get("path"), channels=as_int("channels"))


def build_scenario_model(spec: AttackRunSpec, input_shape, num_classes):
    return build_named_model(spec.model, input_shape, num_classes, spec.seed, spec.activation)


def build_named_model(text: str, input_shape, num_classes: int, seed: int = 0,
                      activation: str | None = None) -> nn.Module:
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
    check_model_fits(model, tuple(input_shape), num_classes, f"model '{text}'")
    return model


def run_attack(spec: AttackRunSpec, progress: Callable[[int, int, float], None] | None = None
               ) -> AttackRunResult:
    """Run one scenario named by registry names (or user references). Deterministic given `spec.seed`."""
    data = load_dataset(dataset_spec(spec.dataset, spec.split, spec.resize))
    model = build_scenario_model(spec, data.input_shape, data.num_classes)
    if spec.checkpoint:
        from .models.checkpoint import load_checkpoint
        load_checkpoint(model, spec.checkpoint)
    if spec.pretrain_steps:
        model = _pretrained(model, spec)
    return run_scenario(spec, model, data, progress,
                        held_out=lambda targets: prior_data(spec.dataset, spec.split, spec.resize, data, targets))


def run_scenario(spec: AttackRunSpec, model: nn.Module, data: Dataset,
                 progress: Callable[[int, int, float], None] | None = None,
                 held_out: Callable[[torch.Tensor], Any] | None = None) -> AttackRunResult:
    """Attack the built `model` on `data` as `spec` describes (its dataset and
    model fields only label the result). The one path behind the CLI, sweeps
    and `gradleak.audit`. `model` is not modified; `held_out(targets)` gives
    held-out examples when the threat model grants them (default: every
    example of `data` that is not a target)."""
    start = time.perf_counter()
    device = pick_device(spec.device)
    attack_spec: ComponentSpec = parse_spec(spec.attack, "attack")
    attack = make_attack(attack_spec)
    chain = make_chain([parse_spec(d, "defense") for d in spec.defenses])
    threat = make_threat_model(spec.threat, spec.knows)
    threat.check(attack_spec.name, attack.needs())
    training = TrainingSpec(lr=spec.lr, local_steps=spec.local_steps, local_epochs=spec.local_epochs,
                            local_batch_size=spec.local_batch_size, batchnorm=spec.bn_mode)

    if data.modality not in attack.modalities:
        raise GradleakError(f"attack '{attack_spec.name}' does not support {data.modality} data")
    n_images = spec.images or spec.batch_size
    others = chain.aggregate_clients - 1
    needed = n_images + others * spec.batch_size
    if needed > len(data):
        raise GradleakError(f"dataset '{data.name}' has {len(data)} examples, the scenario needs {needed}")

    model = chain.transform_model(copy.deepcopy(model))
    warn_if_output_ignores_input(model, data.inputs)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(spec.seed))
    targets = order[:n_images]
    pool = order[n_images:]
    prior = None
    if "prior_data" in threat.grants:
        prior = held_out(targets) if held_out is not None else _held_out(data, targets)
    ctx = AttackContext(seed=spec.seed, device=device, progress=progress, prior_data=prior)
    server_secrets = None
    if attack.malicious:
        prepared = attack.prepare_model(model, data.input_shape, data.num_classes, ctx)
        model, server_secrets = prepared.model, prepared.secrets
    model = model.to("cpu")

    scores, originals, recons, iterations, extras, runs = [], [], [], [], {}, []
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
        bn = capture_bn_statistics(model, x) if "bn_statistics" in threat.grants else None
        obs = observe(update, copy.deepcopy(model), threat, input_shape=data.input_shape,
                      num_classes=data.num_classes, training=training, batch_size=batch_total,
                      labels=y, defenses=chain.defenses, modality=data.modality,
                      bn_statistics=bn, prior_data=prior, server_secrets=server_secrets)
        batch_ctx = AttackContext(seed=batch_attack_seed(spec.seed, b), device=device, progress=progress)
        rec, batch_scores, aligned = attack_observation(attack, obs, x, y, batch_ctx, spec.lpips)
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


def attack_observation(attack: Attack, obs: Observation, x: torch.Tensor, y: torch.Tensor,
                       ctx: AttackContext, lpips: str = "alex"):
    """Reconstruct from one observation and score it against the batch (x, y)
    the client trained on: (Reconstruction, per-image scores, aligned reconstructions)."""
    rec = attack.reconstruct(obs, ctx)
    batch_scores, aligned = score_batch(x, y, rec.inputs, rec.labels, obs.modality, lpips)
    return rec, batch_scores, aligned


def convergence_summary(runs: list[Reconstruction]) -> dict:
    """Whether every batch's attack reported convergence, its final matching distance, its
    trace, and whether it ran out of budget (see `under_budget`)."""
    flags = [r.converged for r in runs if r.converged is not None]
    distances = [r.final_distance for r in runs if r.final_distance is not None]
    improving = [still_improving(r.trace) for r in runs]
    converged = all(flags) if flags else None
    return {"converged": converged,
            "final_distance": max(distances) if distances else None,
            "still_improving": any(v for v in improving if v is not None) if any(
                v is not None for v in improving) else None,
            "under_budget": under_budget(converged, improving),
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


def under_budget(converged: bool | None, improving: list[bool | None]) -> bool | None:
    """An attack result whose failure may be the budget's, not the defense's: it reported
    that it did not converge, or some batch was still improving at the end. None when the
    attack reports neither (analytic attacks)."""
    if converged is False or any(v for v in improving if v is not None):
        return True
    if converged is None and all(v is None for v in improving):
        return None
    return False


def _held_out(data: Dataset, targets: torch.Tensor) -> Dataset:
    mask = torch.ones(len(data), dtype=torch.bool)
    mask[targets] = False
    return data.subset(mask.nonzero().flatten())


def _pretrained(model, spec: AttackRunSpec):
    from .models.training import pretrain

    train = load_dataset(dataset_spec(spec.dataset, "train", spec.resize))
    if train.samples_only:
        raise GradleakError(f"dataset '{train.name}' ships only sample images; it cannot pre-train a model "
                            "(use --checkpoint, or pre-train on mnist/fashion-mnist)")
    pretrain(model, train, steps=spec.pretrain_steps, seed=spec.seed)
    return model


def prior_data(dataset: str, split: str, resize: int | None, data: Dataset, targets: torch.Tensor) -> Dataset:
    """Held-out examples for attacks that may use the data distribution: the
    other split of a named dataset, or the non-target examples of a sample set."""
    if data.samples_only:
        return _held_out(data, targets)
    other = "train" if split == "test" else "test"
    return load_dataset(dataset_spec(dataset, other, resize))


def result_record(result: AttackRunResult) -> dict:
    """A picklable, JSON-shaped record of one result for the results store:
    metrics, extras (with the attack's convergence report), the comparison grid
    and every image pair as PNG bytes."""
    import io

    from .viz import image_grid

    def png(image) -> bytes:
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue()

    images, grid = [], None
    if result.originals.dim() == 4:
        grid = png(image_grid([result.originals, result.reconstructions]))
        for i, score in enumerate(result.per_image):
            images.append({"idx": i, "metrics": score,
                           "original": png(image_grid([result.originals[i:i + 1]], pad=0)),
                           "reconstruction": png(image_grid([result.reconstructions[i:i + 1]], pad=0))})
    else:
        images = [{"idx": i, "metrics": s, "original": None, "reconstruction": None}
                  for i, s in enumerate(result.per_image)]
    extras = jsonable(result.extras)
    if result.convergence:
        extras["convergence"] = jsonable(result.convergence)
    return {"metrics": result.metrics, "extras": extras, "seconds": result.seconds,
            "grid_png": grid, "images": images}


def write_outputs(result: AttackRunResult, out: str | Path) -> dict[str, Path]:
    """result.json and grid.png in `out`, each written atomically."""
    from .viz import save_grid

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "result.json", "grid": out / "grid.png"}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=2))
    tmp.replace(paths["json"])
    if result.originals.dim() == 4:
        save_grid(paths["grid"], result.originals, result.reconstructions)
    else:
        paths.pop("grid")
    return paths


def jsonable(value):
    """JSON-safe copy: tensors become lists, anything else unknown its text."""
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
