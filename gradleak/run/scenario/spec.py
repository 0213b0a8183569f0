"""One attack scenario's declaration and its result: `AttackRunSpec` (everything that defines
a run, given the seed) and `AttackRunResult` (what the run reached, with the CLI's JSON)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property

import torch

from ...errors import GradleakError
from ...fl import TrainingSpec
from ...fl.training import check_bn_mode, scenario_fields, training_from_scenario
from ...modalities import modality as modality_record
from ...options import RUN_SPEC_BOUNDS, ComponentSpec, check_device, check_range, parse_chain, parse_spec


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
    # undecided (gradleak.run.ladder); 0: the attack runs once at its own budget
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

    # The run's components parsed once, where the run's texts become typed (the texts stay the
    # fields: the store's keys and labels are their canonical form, `str(spec)`).
    @cached_property
    def attack_spec(self) -> ComponentSpec:
        return parse_spec(self.attack, "attack")

    @cached_property
    def defense_specs(self) -> tuple[ComponentSpec, ...]:
        return parse_chain(self.defenses)

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
    per_example: list[dict]
    seconds: float
    originals: torch.Tensor
    reconstructions: torch.Tensor
    extras: dict = field(default_factory=dict)
    # converged / final_distance / trace as the attack reported them (None: not reported)
    convergence: dict = field(default_factory=dict)
    # the attacked data's modality (gradleak.modalities), as the observation carried it
    modality: str = field(kw_only=True)

    def __repr__(self) -> str:
        return f"AttackRunResult({self.summary()})"

    def summary(self) -> str:
        """The run in one line: what was attacked, and what the attack reached."""
        s, m = self.spec, self.metrics
        parts = [f"{s.attack} on {s.dataset}/{s.model}, batch {s.batch_size}, "
                 f"defenses {', '.join(s.defenses) or 'none'}, seed {s.seed}:"]
        scores = []
        headline = modality_record(self.modality).score_line(m, ", ")
        if headline is not None:
            scores.append(headline)
        elif m.get("mse") is not None:  # nothing to show in the data's own scores (e.g. no PSNR)
            scores.append(f"MSE {m['mse']:.3g}")
        n = int(m.get("examples") or len(self.per_example))
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
            "n_examples": len(self.per_example),
            "metrics": self.metrics,
            "seconds": self.seconds,
            # the attack's seconds and the auditor's seconds judging it (scores, gallery), apart
            "attack_seconds": (self.extras.get("ladder") or {}).get("attack_seconds"),
            "judge_seconds": (self.extras.get("ladder") or {}).get("judge_seconds"),
            "per_example": self.per_example,
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


def jsonable(value):
    """JSON-safe copy: tensors become lists, anything else unknown its text."""
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
