"""How a client trains locally (the FL setting an attack is run under)."""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import GradleakError
from ..options import check
from ..registry import Registry

BN_MODES = ("train", "eval")  # batch norm in local training: batch or running statistics
# How the client orders its examples each epoch: a fixed cyclic order; a seeded shuffle whose
# seed the server knows (it set it, or the app reports it); a shuffle it cannot replay.
SHUFFLE_MODES = ("none", "known", "unknown")
# Data augmentation the client applies to every example at every step, as torchvision's
# RandomCrop(size, padding) with zero padding and RandomHorizontalFlip(0.5) do: the server
# knows the distribution, never the draws.
AUGMENTATIONS = ("crop", "flip")


@dataclass(frozen=True)
class SGDOptions:
    """`torch.optim.SGD`'s options (the learning rate is the training's `lr`)."""

    momentum: float = field(default=0.0, metadata={"range": (0.0, 1.0)})
    dampening: float = field(default=0.0, metadata={"range": (0.0, 1.0)})
    nesterov: bool = False
    weight_decay: float = field(default=0.0, metadata={"range": (0.0, 1.0)})

    def __post_init__(self) -> None:
        check(not self.nesterov or (self.momentum > 0 and self.dampening == 0),
              "optimizer 'sgd': nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)")


@dataclass(frozen=True)
class AdamOptions:
    """`torch.optim.Adam`'s / `AdamW`'s options (the learning rate is the training's `lr`)."""

    beta1: float = field(default=0.9, metadata={"range": (0.0, 0.999999)})
    beta2: float = field(default=0.999, metadata={"range": (0.0, 0.999999)})
    eps: float = field(default=1e-8, metadata={"range": (1e-30, 1.0)})
    weight_decay: float = field(default=0.0, metadata={"range": (0.0, 1.0)})


# The client optimizers gradleak replays, with torch.optim's semantics step for step (their
# classes in fl.optimizers; tests/fl/test_client_training.py checks them against torch.optim).
OPTIMIZERS: Registry = Registry("optimizer", {
    "sgd": "gradleak.fl.optimizers:SGD",
    "adam": "gradleak.fl.optimizers:Adam",
    "adamw": "gradleak.fl.optimizers:AdamW",
})


def parse_optimizer(text: str) -> tuple[str, SGDOptions | AdamOptions]:
    """`sgd`, `sgd:momentum=0.9,weight_decay=5e-4`, `adam`, `adamw:weight_decay=0.05`, ... →
    (name, options); one line naming the supported optimizers otherwise."""
    from ..options import build_options, parse_spec

    if not isinstance(text, str):
        raise GradleakError(f"optimizer must be a text such as 'sgd:momentum=0.9', got {text!r}")
    spec = parse_spec(text, "optimizer")
    if spec.name not in OPTIMIZERS:
        raise GradleakError(f"unknown optimizer '{spec.name}'; gradleak replays: {', '.join(OPTIMIZERS)} "
                            "(with torch.optim's options)")
    optimizer = OPTIMIZERS.get(spec.name)
    raw = {**optimizer.option_defaults, **spec.options}
    return spec.name, build_options(optimizer.Options, raw, f"optimizer '{spec.name}'")


def check_bn_mode(mode: str) -> None:
    """The one check of a batch-norm mode, shared by every spec that takes one."""
    check(mode in BN_MODES, f"--bn-mode must be 'train' or 'eval', got '{mode}'")


@dataclass(frozen=True)
class TrainingSpec:
    """Local training of one client.

    local_steps = 1 with no epochs is FedSGD: the client sends one gradient.
    Otherwise FedAvg: `local_steps` optimizer steps (or `local_epochs` passes) over
    mini-batches of `local_batch_size` taken in a fixed cyclic order, and the
    client sends the weight delta. The fixed order is what lets a server that
    knows the local hyper-parameters replay training exactly.

    `shuffle_seed`: the client draws its mini-batches as `DataLoader(..., batch_size=
    local_batch_size, shuffle=True, generator=torch.Generator().manual_seed(shuffle_seed))`
    does, epoch after epoch (a fresh order each epoch, the last mini-batch shorter), and the
    server, knowing the seed, replays the same order.

    `optimizer` is the client's optimizer as `name[:k=v,...]` (`OPTIMIZERS`): plain SGD
    by default, or SGD with momentum, dampening, Nesterov and weight decay, Adam or AdamW,
    with torch.optim's semantics. A client with any other than plain SGD sends its weight
    delta even after one step (a FedSGD client sends the raw gradient, before any optimizer).

    `shuffle` "unknown" (`order`): the client shuffles every epoch with a generator the server does not
    know (`shuffle_seed` is then the client's own seed, hidden from the server by
    `server_view`). `augment` ("crop", "flip") draws a random crop of the zero-padded example
    (`crop_padding` pixels each side) and a horizontal flip with probability 0.5, per example
    and step, from the client's own generator. `label_smoothing` is cross-entropy's (as
    `F.cross_entropy(label_smoothing=...)`), and `clip_norm` clips each step's whole gradient
    to that L2 norm before the optimizer step (`torch.nn.utils.clip_grad_norm_`).

    `lora_rank`: the client fine-tunes LoRA adapters of that rank on the attention Q/K/V
    projections (`gradleak.models.lora`, Hu et al., ICLR 2022), the base weights frozen, and
    sends only the adapter tensors; `lora_alpha` is the adapters' α (scaling α / r; default r),
    `lora_b_std` draws B Gaussian with that deviation instead of zero (adapters part-way through
    a fine-tuning). The adapters are added where the scenario prepares the client's model
    (`prepare_model`), so every attack sees the model the client trains.

    `batchnorm` is how batch-norm layers normalise during local training:
    "train" uses each batch's own statistics (PyTorch's training mode), "eval"
    the model's running statistics (frozen batch norm, as in inversefed's
    experiments, which call `model.eval()` before computing the gradient).
    """

    lr: float = 0.1
    local_steps: int = 1
    local_epochs: int | None = None
    local_batch_size: int | None = None  # None: the whole client batch every step
    batchnorm: Literal["train", "eval"] = "train"
    optimizer: str = "sgd"
    # the seed of the client's shuffling DataLoader (its generator, known to the server): None,
    # mini-batches in a fixed cyclic order
    shuffle_seed: int | None = None
    # the client sends its buffers (batch-norm running statistics) with its update, as a
    # Flower client returning its whole state dict does
    sends_buffers: bool = False
    # None: "known" when a shuffle_seed is given, else "none" (see `order`)
    shuffle: Literal["none", "known", "unknown"] | None = None
    augment: tuple[str, ...] = ()
    crop_padding: int = 4
    label_smoothing: float = 0.0
    clip_norm: float | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_b_std: float = 0.0

    def __post_init__(self) -> None:
        check(self.shuffle is None or self.shuffle in SHUFFLE_MODES,
              f"--shuffle must be one of {', '.join(SHUFFLE_MODES)}, got {self.shuffle!r}")
        check(self.shuffle != "known" or self.shuffle_seed is not None,
              "--shuffle known needs the client's --shuffle-seed (the server replays that order)")
        check(self.shuffle != "none" or self.shuffle_seed is None,
              "--shuffle none takes no --shuffle-seed")
        check(isinstance(self.augment, tuple) and all(a in AUGMENTATIONS for a in self.augment),
              f"--augment takes {', '.join(AUGMENTATIONS)} (comma-separated), got {self.augment!r}")
        check(0 <= self.crop_padding <= 64, f"--crop-padding must be 0..64, got {self.crop_padding}")
        check(0.0 <= self.label_smoothing < 1.0,
              f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        check(self.clip_norm is None or (self.clip_norm > 0 and math.isfinite(self.clip_norm)),
              f"--clip-norm must be a positive number, got {self.clip_norm}")
        check(self.lora_rank is None or (not isinstance(self.lora_rank, bool) and isinstance(self.lora_rank, int)
                                         and self.lora_rank >= 1),
              f"--lora takes the adapters' rank, a whole number >= 1, got {self.lora_rank!r}")
        check(self.lora_alpha is None or (self.lora_alpha > 0 and math.isfinite(self.lora_alpha)),
              f"--lora-alpha must be a positive number, got {self.lora_alpha}")
        check(self.lora_b_std >= 0 and math.isfinite(self.lora_b_std),
              f"--lora-b-std must be a number >= 0, got {self.lora_b_std}")
        check(self.lora_rank is not None or (self.lora_alpha is None and self.lora_b_std == 0),
              "--lora-alpha and --lora-b-std need --lora RANK")
        parse_optimizer(self.optimizer)  # one line naming the supported optimizers, if not one
        check(self.lr > 0 and math.isfinite(self.lr), f"--lr must be a positive number, got {self.lr}")
        check(self.local_steps >= 1, f"--local-steps must be >= 1, got {self.local_steps}")
        check(self.local_epochs is None or self.local_epochs >= 1,
              f"--local-epochs must be >= 1, got {self.local_epochs}")
        check(self.local_epochs is None or self.local_steps == 1,
              f"--local-steps {self.local_steps} and --local-epochs {self.local_epochs}: a client trains a number "
              "of steps or of passes over its data; give one")
        check(self.local_batch_size is None or self.local_batch_size >= 1,
              f"--local-batch-size must be >= 1, got {self.local_batch_size}")
        check_bn_mode(self.batchnorm)
        check(self.shuffle_seed is None or self.shuffle_seed >= 0,
              f"--shuffle-seed must be >= 0, got {self.shuffle_seed}")

    @functools.cached_property
    def optimizer_name(self) -> str:
        return parse_optimizer(self.optimizer)[0]

    @functools.cached_property
    def optimizer_options(self) -> SGDOptions | AdamOptions:
        return parse_optimizer(self.optimizer)[1]

    @property
    def plain_sgd(self) -> bool:
        """The client steps by lr × gradient: no momentum, no weight decay, no Adam."""
        return self.optimizer_name == "sgd" and self.optimizer_options == SGDOptions()

    @property
    def order(self) -> str:
        """How the client orders its examples: "none" (cyclic), "known" or "unknown" shuffle."""
        return self.shuffle or ("known" if self.shuffle_seed is not None else "none")

    @property
    def plain_loss(self) -> bool:
        """Each step's gradient is the plain mean cross-entropy's: no label smoothing, no
        clipping (what the FedSGD fast paths of the attacks compute)."""
        return self.label_smoothing == 0.0 and self.clip_norm is None

    @property
    def replayable(self) -> bool:
        """The server can recompute this client's update from candidate data: it knows the
        order of the mini-batches and nothing random touched the examples."""
        return self.order != "unknown" and not self.augment

    def server_view(self) -> "TrainingSpec":
        """What a server that set the protocol knows of this training: everything but the
        seed of a shuffle it cannot replay."""
        if self.order != "unknown" or self.shuffle_seed is None:
            return self
        return dataclasses.replace(self, shuffle_seed=None)

    def prepare_model(self, model, seed: int = 0):
        """The model the client trains, built from the server's `model` (modified in place):
        with `lora_rank`, LoRA adapters on its attention projections and every other
        parameter frozen (A drawn from a generator seeded `seed`); otherwise `model` itself."""
        if self.lora_rank is None:
            return model
        from ..models.lora import apply_lora

        return apply_lora(model, self.lora_rank, self.lora_alpha, seed, self.lora_b_std)

    @property
    def is_fedsgd(self) -> bool:
        return (self.local_steps == 1 and self.local_epochs is None and self.local_batch_size is None
                and self.plain_sgd)

    def step_batch_size(self, samples: int) -> int:
        return min(self.local_batch_size or samples, samples)

    def num_steps(self, samples: int) -> int:
        if self.local_epochs is not None:
            return self.local_epochs * math.ceil(samples / self.step_batch_size(samples))
        return self.local_steps

    def step_indices(self, samples: int) -> list[tuple[int, ...]]:
        """Example indices of every local step: cycling through the data in order, or, with a
        `shuffle_seed`, in the order a seeded shuffling DataLoader gives."""
        b = self.step_batch_size(samples)
        steps = self.num_steps(samples)
        if self.order == "none":
            return [tuple((s * b + j) % samples for j in range(b)) for s in range(steps)]
        if self.shuffle_seed is None:  # an unknown shuffle, as the server sees it
            raise GradleakError("the client's batch order is unknown to the server (--shuffle unknown): "
                                "an attack that replays the order cannot run; use 'fedavg'")
        import torch

        generator = torch.Generator().manual_seed(self.shuffle_seed)
        out: list[tuple[int, ...]] = []
        while len(out) < steps:
            # what one pass of DataLoader(shuffle=True, generator=generator) draws: its
            # iterator's base seed, the sampler's permutation, and the permutation the sampler
            # draws for the remainder once the epoch is exhausted
            torch.empty((), dtype=torch.int64).random_(generator=generator)
            order = torch.randperm(samples, generator=generator).tolist()
            torch.randperm(samples, generator=generator)
            out += [tuple(order[i:i + b]) for i in range(0, samples, b)]
        return out[:steps]


# The one list of the client's training fields: TrainingSpec's own. Where a scenario spec, the
# command line, a sweep file or a Flower run config names one differently, it is listed here.
SCENARIO_NAMES = {"batchnorm": "bn_mode", "lora_rank": "lora"}


def training_field_names() -> tuple[str, ...]:
    """TrainingSpec's fields, in order."""
    import dataclasses

    return tuple(f.name for f in dataclasses.fields(TrainingSpec))


@functools.cache
def training_field_types() -> dict[str, type]:
    """Each TrainingSpec field's value type, read from its annotation: int, float, str (a
    `Literal` of texts too), bool, or tuple (a list of texts); optional or not."""
    import types
    import typing

    def value_type(hint) -> type:
        origin = typing.get_origin(hint)
        if origin is Literal:
            return type(typing.get_args(hint)[0])
        if origin in (typing.Union, types.UnionType):
            return value_type(next(a for a in typing.get_args(hint) if a is not type(None)))
        return tuple if origin is tuple else hint

    hints = typing.get_type_hints(TrainingSpec)
    return {name: value_type(hints[name]) for name in training_field_names()}


def scenario_fields(training: TrainingSpec) -> dict:
    """The scenario (`AttackRunSpec`) fields that declare `training`."""
    return {SCENARIO_NAMES.get(name, name): getattr(training, name) for name in training_field_names()}


def training_from_scenario(values) -> TrainingSpec:
    """The TrainingSpec a scenario (an object or mapping with `scenario_fields`' names) declares."""
    get = values.get if isinstance(values, dict) else lambda name: getattr(values, name)
    fields: dict[str, Any] = {name: get(SCENARIO_NAMES.get(name, name)) for name in training_field_names()}
    return TrainingSpec(**fields)

