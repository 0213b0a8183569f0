"""Learning to Invert (Wu, Chen, Guo and Weinberger, UAI 2023): an inverter learned on the
defended updates themselves.

The server knows the protocol: the model it sent, the client's training and its defenses
with their parameters. It plays the client on auxiliary images — held-out examples when the
threat model grants `prior_data`, else crops of public photographs
(`gradleak.data.auxiliary`) with random labels — running the very training and defense
chain the client runs (`compute_update`), and trains a network to map each resulting update
back to its images. The update enters as a fixed count sketch (a sparse random projection:
each entry added, with a random sign, to one of `sketch` buckets), standardised per bucket,
so that large models fit; the recovered labels enter one-hot, in the recovered order, so
the network knows which classes to draw. Slots are matched to the true images by Hungarian
assignment in the loss, because an update does not order its examples.

The attack adapts to any defense the server can simulate: the inverter sees exactly what
the defense leaves (signs, the top entries, a quantised or noised update), where gradient
matching optimises against a transformed target it can only approximate.

The auditor's budget ladder doubles the training epochs, resuming the training. The first
rung's inverter is kept (safetensors) in the study's artifacts folder under a key of
everything that determines it (model weights, defenses, training, batch, options, auxiliary
data, seed), so every cell and audit call with the same key reuses it instead of training
again; `init=learned` starts the optimisation attacks from its output.

Over 400 lines: the update sketch, the inverter, its training and its cache are one attack's
pieces; this docstring is 25 of them.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from ...errors import GradleakError
from ...fl import aggregate_updates, compute_update
from ...models.base import hash_weights
from ...options import check
from ...seeding import stream
from ...threat import Observation
from ..base import LEARNED_KNOWLEDGE, Attack, AttackContext, Reconstruction
from ..replay.labels import recover_labels


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


# The auxiliary updates and their images are held in memory while the inverter trains.
TRAINING_SET_BYTES = 4 * 2**30


class UpdateSketch:
    """A count sketch of flattened updates: entry j goes, times sign_j, to bucket h(j). Linear,
    O(parameters) memory, and fixed by its seed, so the server sketches the observed update as it
    sketched the training ones."""

    def __init__(self, entries: int, buckets: int, seed: int):
        self.entries = entries
        self.buckets = min(buckets, entries)
        generator = stream(seed, "learned", "sketch")
        if self.buckets == entries:  # small update: every entry is its own bucket, nothing mixed
            self.index = torch.arange(entries)
            self.sign = torch.ones(entries)
        else:
            self.index = torch.randint(self.buckets, (entries,), generator=generator)
            self.sign = torch.randint(2, (entries,), generator=generator).float() * 2 - 1

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(flat.shape[0], self.buckets, dtype=flat.dtype)
        return out.index_add_(1, self.index, flat * self.sign)


class Inverter(nn.Module):
    """Sketched update + one-hot labels → `slots` images in [0, 1]."""

    def __init__(self, features: int, num_classes: int, slots: int, image_shape: tuple[int, ...], hidden: int):
        super().__init__()
        self.slots, self.image_shape, self.num_classes = slots, tuple(image_shape), num_classes
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("scale", torch.ones(features))
        pixels = math.prod(image_shape)
        self.net = nn.Sequential(nn.Linear(features + slots * num_classes, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, slots * pixels))

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(labels, self.num_classes).float().flatten(1)
        x = torch.cat([(features - self.mean) / self.scale, onehot], dim=1)
        return torch.sigmoid(self.net(x)).view(-1, self.slots, *self.image_shape)


@dataclass
class AuxiliaryUpdates:
    features: torch.Tensor  # (N, buckets): the sketched updates
    images: torch.Tensor  # (N, slots, *image_shape)
    labels: torch.Tensor  # (N, slots), in the order the attack recovers them (sorted)
    seconds: float


def _sorted_by_label(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.sort(labels, stable=True).indices
    return images[order], labels[order]


def auxiliary_updates(obs: Observation, pool_inputs: torch.Tensor, pool_labels: torch.Tensor | None,
                      samples: int, sketch: UpdateSketch, seed: int,
                      device: torch.device | None = None) -> AuxiliaryUpdates:
    """`samples` updates the client would send for batches drawn from the pool, through its
    training and defense chain (secure aggregation: every client of the sum drawn from the pool).
    Without pool labels (public photos) each example gets a uniform random label. `device`
    computes the batched FedSGD gradients (the bulk of the work) there; the defenses and the
    client's own loop run where the observed model lives."""
    from ...defenses import DefenseChain

    start = time.perf_counter()
    chain = DefenseChain(list(obs.get("defenses")))
    clients = chain.aggregate_clients
    per_client = obs.batch_size // clients
    draw = stream(seed, "learned", "batches")
    picks = torch.randint(len(pool_inputs), (samples, clients, per_client), generator=draw)
    inputs = pool_inputs[picks]  # (samples, clients, per_client, *shape)
    labels = pool_labels[picks] if pool_labels is not None else \
        torch.randint(obs.num_classes, (samples, clients, per_client), generator=draw)
    sent = client_updates(obs, chain, inputs.flatten(0, 1), labels.flatten(0, 1), seed, device)
    features, images, slot_labels = [], [], []
    for i in range(samples):  # updates are sketched as they come: only a chunk is held at a time
        mine = [next(sent) for _ in range(clients)]
        update = aggregate_updates(mine) if clients > 1 else mine[0]
        x, y = _sorted_by_label(inputs[i].flatten(0, 1), labels[i].flatten(0, 1))
        features.append(sketch(update.flat()[None].float())[0])
        images.append(x)
        slot_labels.append(y)
    return AuxiliaryUpdates(torch.stack(features), torch.stack(images), torch.stack(slot_labels),
                            time.perf_counter() - start)


def client_updates(obs: Observation, chain, inputs: torch.Tensor, labels: torch.Tensor, seed: int,
                    device: torch.device | None = None) -> Iterator:
    """The update of each client `i` training on (inputs[i], labels[i]), in order, as
    `compute_update` sends it. One FedSGD step of the plain loss, defended only at the update,
    is every client's mean per-example gradient (torch.func, many clients per pass) with the
    defenses applied after it; anything else runs the client's own loop."""
    clients = [stream(seed, "learned", "client", i) for i in range(len(inputs))]
    first = compute_update(obs.model, inputs[0], labels[0], obs.training, chain, clients[0])
    yield first
    if not _one_plain_step(obs, chain):
        for i in range(1, len(inputs)):
            yield compute_update(obs.model, inputs[i], labels[i], obs.training, chain, clients[i])
        return
    from ...fl.local import batchnorm_mode
    from ...fl.places import DefenseContext

    template = first if not len(chain) else compute_update(obs.model, inputs[0], labels[0], obs.training)
    with batchnorm_mode(obs.model, obs.training.batchnorm):  # as the client's step: running statistics
        for start, gradients in _mean_per_example_gradients(obs.model, inputs[1:], labels[1:], device):
            for j in range(len(next(iter(gradients.values())))):
                update = template.replace(tensors={n: gradients[n][j] for n in template.tensors})
                i = 1 + start + j
                yield chain.transform_update(update, DefenseContext(clients[i], {}, obs.training, obs.model))


def _one_plain_step(obs: Observation, chain) -> bool:
    from ...fl.buffers import batchnorm_layers

    training = obs.training
    active_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) and m.training for m in obs.model.modules())
    batch_statistics = training.batchnorm == "train" and bool(batchnorm_layers(obs.model))
    return (training.is_fedsgd and training.plain_loss and not training.augment and not active_dropout
            and not batch_statistics and all(set(d.places) == {"update"} for d in chain))


def _mean_per_example_gradients(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                                device: torch.device | None = None) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """(first client, each client's mean-loss gradient) chunk by chunk (clients × batch examples,
    DP-SGD's per-example gradients, about 512 MB at a time), computed on `device` (default: the
    model's) and returned where the model lives."""
    from ...defenses.dpsgd import per_example_gradients
    from ...fl.local import model_state

    home = next(model.parameters()).device
    device = device or home
    params, buffers = model_state(model)
    if device != home:
        params = {n: p.detach().to(device).requires_grad_(p.requires_grad) for n, p in params.items()}
        buffers = {n: b.to(device) for n, b in buffers.items()}
    clients, batch = labels.shape
    entries = sum(p.numel() for p in params.values() if p.requires_grad)
    chunk = max(1, (2 ** 27 // entries) // batch)  # clients per pass
    for start in range(0, clients, chunk):
        x = inputs[start:start + chunk].flatten(0, 1).to(device)
        y = labels[start:start + chunk].flatten(0, 1).to(device)
        yield start, {name: g.detach().view(-1, batch, *g.shape[1:]).mean(1).to(home)
                      for name, g in per_example_gradients(model, params, buffers, x, y).items()}


def matched_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error with each update's output slots matched to its images (Hungarian):
    the loss does not ask the network for an order the update does not carry."""
    if output.shape[1] == 1:
        return F.mse_loss(output, target)
    cost = ((output[:, :, None] - target[:, None]) ** 2).flatten(3).mean(3)  # (N, slots, slots)
    cols = torch.stack([torch.as_tensor(linear_sum_assignment(c)[1]) for c in cost.detach().cpu().numpy()])
    return cost.gather(2, cols.to(cost.device)[..., None]).mean()


@dataclass
class TrainingState:
    inverter: Inverter
    optimizer: torch.optim.Adam
    epochs: int = 0
    seconds: float = 0.0


def _train(state: TrainingState, data: AuxiliaryUpdates, until: int, batch: int, seed: int,
           device: torch.device) -> None:
    start = time.perf_counter()
    features, images, labels = (t.to(device) for t in (data.features, data.images, data.labels))
    state.inverter.train()
    while state.epochs < until:
        # each epoch's order from its own stream: training resumed from a saved epoch is the same run
        order = torch.randperm(len(features), generator=stream(seed, "learned", "epoch", state.epochs)).to(device)
        for chunk in order.split(batch):
            loss = matched_mse(state.inverter(features[chunk], labels[chunk]), images[chunk])
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            state.optimizer.step()
        state.epochs += 1
    state.inverter.eval()
    state.seconds += time.perf_counter() - start


class InverterCache:
    """Trained inverters' weights in a folder: `<key>-<epochs>.safetensors` plus a JSON record of
    what they cost. Written atomically, so cells running side by side can share the folder."""

    def __init__(self, folder: Path | None):
        self.folder = folder

    def path(self, key: str, epochs: int) -> Path | None:
        return None if self.folder is None else self.folder / f"{key}-{epochs}.safetensors"

    def load(self, key: str, epochs: int, state: TrainingState) -> dict | None:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = self.path(key, epochs)
        if path is None or not path.is_file():
            return None
        try:
            state.inverter.load_state_dict(load_file(path))
            record = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as exc:
            raise GradleakError(f"kept inverter {path} is unreadable or not this setting's "
                                f"({' '.join(str(exc).split())[:200]}); delete it to train again") from None
        state.epochs, state.seconds = epochs, float(record["train_seconds"])
        state.inverter.eval()
        return record

    def save(self, key: str, state: TrainingState, record: dict) -> None:
        from safetensors.torch import save_file

        path = self.path(key, state.epochs)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.inverter.state_dict().items()}
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        save_file(tensors, partial)
        os.replace(partial, path)
        record_path = path.with_suffix(".json")
        partial_record = record_path.with_name(f".{record_path.name}.{os.getpid()}")
        partial_record.write_text(json.dumps(record))
        os.replace(partial_record, record_path)


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
        if not obs.kind.pixels:
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
        _train(self.state, self.data, epochs, self.options.batch, self.seed, self.ctx.device)
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
