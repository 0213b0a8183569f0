"""Training the learned inverter and keeping it: the network, its loss, its resumable training
and the cache of trained inverters.

The inverter maps a sketched update, standardised per bucket, and the recovered labels,
one-hot in the recovered order (so the network knows which classes to draw), to the batch's
images. Slots are matched to the true images by Hungarian assignment in the loss, because an
update does not order its examples. Each epoch's order comes from its own stream, so training
resumed from a saved epoch is the same run. A trained inverter is kept (safetensors) under the
key the attack gives it, of everything that determines it (model weights, defenses, training,
batch, options, auxiliary data, seed), so every cell and audit call with the same key reuses it
instead of training again.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from ...errors import GradleakError
from ...seeding import stream
from .updates import AuxiliaryUpdates

# The auxiliary updates and their images are held in memory while the inverter trains.
TRAINING_SET_BYTES = 4 * 2**30


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


def train_inverter(state: TrainingState, data: AuxiliaryUpdates, until: int, batch: int, seed: int,
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
