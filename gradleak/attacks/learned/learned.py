"""Learning to Invert (Wu, Chen, Guo and Weinberger, UAI 2023): an inverter learned on the
defended updates themselves.

The server knows the protocol: the model it sent, the client's training and its defenses
with their parameters. It plays the client on auxiliary images — held-out examples when the
threat model grants `prior_data`, else crops of public photographs
(`gradleak.data.auxiliary`) with random labels — running the very training and defense
chain the client runs (`compute_update`; `updates.py`), and trains a network to map each
resulting update back to its images (`training.py`): the update enters as a fixed count
sketch, the recovered labels one-hot in the recovered order, and slots are matched to the
true images by Hungarian assignment in the loss, because an update does not order its examples.

The attack adapts to any defense the server can simulate: the inverter sees exactly what
the defense leaves (signs, the top entries, a quantised or noised update), where gradient
matching optimises against a transformed target it can only approximate.

The auditor's budget ladder doubles the training epochs, resuming the training. The first
rung's inverter is kept (safetensors) in the study's artifacts folder under a key of
everything that determines it (model weights, defenses, training, batch, options, auxiliary
data, seed), so every cell and audit call with the same key reuses it instead of training
again; `init=learned` starts the optimisation attacks from its output.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ...errors import GradleakError
from ...models.base import hash_weights
from ...options import check
from ...seeding import stream
from ...threat import Observation
from ..base import LEARNED_KNOWLEDGE, Attack, AttackContext, Reconstruction
from ..replay.labels import recover_labels
from .training import TRAINING_SET_BYTES, Inverter, InverterCache, TrainingState, train_inverter
from .updates import AuxiliaryUpdates, UpdateSketch, auxiliary_updates


@dataclass
class LearnedOptions:
    # Chosen on fashion-mnist (LeNet, batch 1 and 4, signSGD / top-k / none); reported on MNIST and
    # cifar10 (docs/learned-inversion.md).
    epochs: int = field(default=20, metadata={"range": (1, 10_000)})  # of the first rung; the ladder doubles them
    samples: int = field(default=1000, metadata={"range": (2, 100_000)})  # auxiliary updates learned from
    hidden: int = field(default=256, metadata={"range": (1, 8192)})
    # buckets of the update's count sketch (all entries when the update is smaller)
    sketch: int = field(default=2048, metadata={"range": (1, 1_000_000)})
    lr: float = 1e-3
    batch: int = field(default=64, metadata={"range": (1, 4096)})  # updates per training step
    aux: Literal["auto", "prior", "public"] = "auto"  # auto: held-out examples when granted, else public photos
    label_method: Literal["auto", "bias", "weight"] = "auto"

    def __post_init__(self):
        check(self.epochs >= 1, "attack 'learned': epochs must be >= 1")
        check(self.samples >= 2, "attack 'learned': samples must be >= 2")
        check(self.hidden >= 1, "attack 'learned': hidden must be >= 1")
        check(self.sketch >= 1, "attack 'learned': sketch must be >= 1")
        check(self.lr > 0, "attack 'learned': lr must be > 0")
        check(self.batch >= 1, "attack 'learned': batch must be >= 1")


def inverter_key(obs: Observation, options: LearnedOptions, aux_source: str, seed: int) -> str:
    """Everything that determines a trained inverter, hashed: the model's weights, the defenses
    with their options, the client's training as the server knows it, the batch, the options
    (except the epochs, which are the ladder's), the auxiliary data and the seed."""
    digest = hashlib.sha256()
    hash_weights(digest, obs.model)
    settings = {"defenses": [repr(d) for d in obs.get("defenses")], "training": repr(obs.training),
                "batch": obs.batch_size, "shape": list(obs.input_shape), "classes": obs.num_classes,
                "update": [obs.update.kind, obs.update.steps, obs.update.clients],
                "options": {k: v for k, v in asdict(options).items() if k not in ("epochs", "label_method")},
                "aux": aux_source, "seed": seed}
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:24]


class LearnedInversion:
    """One trained (or cached) inverter for one observation's setting, resumable rung by rung."""

    def __init__(self, obs: Observation, options: LearnedOptions, ctx: AttackContext):
        if obs.kind.picture_shape(obs.input_shape) is None:
            raise GradleakError(f"attack 'learned' inverts images; this data is {obs.modality}")
        self.obs, self.options, self.ctx = obs, options, ctx
        stored = options.samples * (obs.batch_size * math.prod(obs.input_shape) + options.sketch)  # floats
        if 4 * stored > TRAINING_SET_BYTES:
            raise GradleakError(f"attack 'learned': {options.samples} training updates of a batch of {obs.batch_size} "
                                f"would hold {4 * stored / 2**30:.1f} GiB (at most {TRAINING_SET_BYTES / 2**30:.0f}); "
                                "lower samples or sketch")
        self.seed = ctx.seed
        self.pool_inputs, self.pool_labels, self.aux_source = self._pool()
        self.sketch = UpdateSketch(obs.update.flat().numel(), options.sketch, self.seed)
        self.key = inverter_key(obs, options, self.aux_source, self.seed)
        self.cache = InverterCache(ctx.artifacts / "inverters" if ctx.artifacts is not None else None)
        self.state = self._untrained()
        self.data: AuxiliaryUpdates | None = None
        self.cached = False

    def _untrained(self) -> TrainingState:
        obs, options = self.obs, self.options
        inverter = Inverter(self.sketch.buckets, obs.num_classes, obs.batch_size, obs.input_shape, options.hidden)
        with torch.no_grad():  # nn.Linear's initialisation, drawn from the attack's own stream
            generator = stream(self.seed, "learned", "init")
            for layer in inverter.net:
                if isinstance(layer, nn.Linear):
                    bound = 1 / math.sqrt(layer.in_features)
                    for p in (layer.weight, layer.bias):
                        p.copy_(torch.rand(p.shape, generator=generator) * 2 * bound - bound)
        inverter.to(self.ctx.device)
        return TrainingState(inverter, torch.optim.Adam(inverter.parameters(), lr=options.lr))

    def _pool(self) -> tuple[torch.Tensor, torch.Tensor | None, str]:
        aux = self.options.aux
        granted = self.obs.knows("prior_data")
        if aux == "prior" and not granted:
            raise GradleakError("attack 'learned': aux=prior needs held-out data (grant prior_data: --threat informed "
                                "or --knows prior_data)")
        if aux == "prior" or (aux == "auto" and granted):
            prior = self.obs.get("prior_data")
            if tuple(prior.input_shape) != tuple(self.obs.input_shape):
                raise GradleakError(f"attack 'learned': held-out data of shape {tuple(prior.input_shape)} for a model "
                                    f"of input shape {tuple(self.obs.input_shape)}")
            digest = hashlib.sha256(prior.inputs.contiguous().numpy().tobytes()).hexdigest()[:16]
            return prior.inputs.float(), prior.labels.long(), f"prior:{digest}"
        from ...data.auxiliary import public_images

        count = min(4 * self.options.samples * self.obs.batch_size, 8192)
        images = public_images(tuple(self.obs.input_shape), count, stream(self.seed, "learned", "photos"))
        return images, None, "public-photos"

    def trained(self, epochs: int) -> TrainingState:
        """The inverter after `epochs` epochs. The first rung (the options' epochs) is kept in the
        artifacts folder and loaded from there when it is; a later rung resumes the training in
        hand, or, past a loaded first rung (whose optimizer state is not kept, to keep the files
        small), trains from the start: either way the same inverter as one uninterrupted run."""
        first = epochs == self.options.epochs
        if first and self.state.epochs == 0 and self.cache.load(self.key, epochs, self.state) is not None:
            self.cached = True
            return self.state
        if self.cached:
            self.state, self.cached = self._untrained(), False
        if self.data is None:
            self.data = auxiliary_updates(self.obs, self.pool_inputs, self.pool_labels, self.options.samples,
                                          self.sketch, self.seed, self.ctx.device)
        if self.state.epochs == 0:
            self.state.inverter.mean.copy_(self.data.features.mean(0))
            self.state.inverter.scale.copy_(self.data.features.std(0).clamp_min(1e-12))
        train_inverter(self.state, self.data, epochs, self.options.batch, self.seed, self.ctx.device)
        if first:
            self.cache.save(self.key, self.state, self.record())
        return self.state

    def record(self) -> dict:
        return {"key": self.key, "epochs": self.state.epochs, "train_seconds": round(self.state.seconds, 3),
                "data_seconds": round(self.data.seconds, 3) if self.data is not None else 0.0,
                "samples": self.options.samples, "aux": self.aux_source, "buckets": self.sketch.buckets}

    def predict(self, labels: torch.Tensor) -> torch.Tensor:
        """The inverter's images for the observed update, slots in the order of `labels`."""
        features = self.sketch(self.obs.update.flat()[None].float()).to(self.ctx.device)
        with torch.no_grad():
            return self.state.inverter(features, labels.reshape(1, -1).to(self.ctx.device))[0].cpu()


class LearnedInverter(Attack):
    """Learning to Invert: a network trained on the defended updates of auxiliary data."""

    name = "learned"
    Options = LearnedOptions
    requires = LEARNED_KNOWLEDGE
    uses = frozenset({"labels", "prior_data"})
    modalities = ("image",)
    iterative = True  # more epochs may change the result: the auditor's ladder doubles them
    budgets = {"quick": {"epochs": 10}, "thorough": {"epochs": 40, "samples": 4000}}

    # The inverter draws every pixel from its last hidden layer; past this many weights per image
    # it would not train on a CPU in a study's time (a 64 × 64 RGB image at hidden 256 is 3.1M).
    MAX_WEIGHTS_PER_IMAGE = 20_000_000

    def unsupported(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                    modality: str) -> str | None:
        reason = super().unsupported(model, input_shape, num_classes, modality)
        weights = math.prod(input_shape) * self.options.hidden
        if reason is None and weights > self.MAX_WEIGHTS_PER_IMAGE:
            reason = (f"its inverter would draw each {'×'.join(map(str, input_shape))} image from {weights:,} weights "
                      f"(at most {self.MAX_WEIGHTS_PER_IMAGE:,}): resize the data or lower hidden")
        return reason

    def budget(self) -> int | None:
        return int(self.options.epochs)

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        learned = LearnedInversion(obs, self.options, ctx)
        labels = torch.sort(recover_labels(obs, self.options.label_method, ctx.generator(17)).cpu()).values
        epochs = self.options.epochs
        while True:
            learned.trained(epochs)
            start = time.perf_counter()
            inputs = learned.predict(labels)
            inference_ms = round(1000 * (time.perf_counter() - start), 3)
            yield Reconstruction(inputs=inputs, labels=labels, iterations=epochs,
                                 extras={"inverter": {**learned.record(), "cached": learned.cached,
                                                      "inference_ms": inference_ms}})
            epochs *= 2

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        return next(iter(self.rungs(obs, ctx)))


def learned_start(obs: Observation, labels: torch.Tensor, ctx: AttackContext, options: Any = None) -> torch.Tensor:
    """`init=learned` for the optimisation attacks: the first rung's images (trained once per key
    and kept in the artifacts folder), slots in the order of `labels`."""
    learned = LearnedInversion(obs, options or LearnedOptions(), ctx)
    learned.trained(learned.options.epochs)
    order = torch.sort(labels.cpu(), stable=True)
    images = learned.predict(order.values)
    out = torch.empty_like(images)
    out[order.indices] = images
    return out
