"""The model, the clients' data and the local training of this Flower app.

Every client holds a Dirichlet(alpha) non-IID share of MNIST's training split (read
offline by gradleak's loader) and, in each round, trains on up to `examples-per-client`
examples of it (0: its whole share) as a PyTorch app usually does: a shuffling DataLoader,
SGD with momentum and weight decay, `local-epochs` passes.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gradleak.data import DatasetSpec, load_dataset
from gradleak.utility import dirichlet_partition


class Net(nn.Module):
    """The CNN of Flower's PyTorch quickstart, for 28×28 MNIST: two convolutions with ReLU and
    max-pooling, then a hidden dense layer (120 units) with ReLU, a second one (84) and the
    classifier — LeNet-5 as apps commonly write it."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class SigmoidNet(nn.Module):
    """A small sigmoid CNN (LeNet-like, as in the gradient-inversion literature): the
    `model = "sigmoid-cnn"` of the small configuration the tests run."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 12, 5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid())
        self.classifier = nn.Linear(12 * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


MODELS = {"lenet5": Net, "sigmoid-cnn": SigmoidNet}


def make_model(config: Mapping[str, Any]) -> nn.Module:
    """The run config's `model`: "lenet5" (default) or "sigmoid-cnn"."""
    name = str(config.get("model", "lenet5"))
    if name not in MODELS:
        raise ValueError(f"run config model '{name}': expected one of {', '.join(MODELS)}")
    return MODELS[name]()


def initial_model(config: Mapping[str, Any]) -> nn.Module:
    torch.manual_seed(int(config["seed"]))
    return make_model(config)


def client_data(partition_id: int, num_partitions: int, config) -> tuple[torch.Tensor, torch.Tensor]:
    """This client's training examples, in the order its DataLoader indexes them: its
    Dirichlet share of MNIST's training split, in a seeded random order, the first
    `examples-per-client` of them (0: all)."""
    seed, alpha = int(config["seed"]), float(config["dirichlet-alpha"])
    train, shards = _partitions(num_partitions, alpha, seed)
    shard = shards[partition_id]
    order = torch.randperm(len(shard), generator=torch.Generator().manual_seed(seed + partition_id))
    cap = int(config["examples-per-client"])
    keep = shard[order[:cap] if cap > 0 else order]
    return train.inputs[keep], train.labels[keep]


@lru_cache(maxsize=2)
def _partitions(num_partitions: int, alpha: float, seed: int):
    """MNIST's training split and its Dirichlet shares, read once per process (a simulation
    worker serves many clients)."""
    train = load_dataset(DatasetSpec("mnist", split="train"))
    return train, dirichlet_partition(train.labels, num_partitions, alpha, seed)


def held_out_examples(count: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST test examples (no client trains on the test split) and their labels, so that a
    reconstruction is linked among the gallery's digits of its own class (the update gives the
    labels away; docs/judging.md). 300 of them: re-identifying a reconstruction compares it with
    every one (SSIM), the cost that dominates an audit of clients with hundreds of examples
    (docs/flower.md)."""
    test = load_dataset(DatasetSpec("mnist", split="test"))
    return test.inputs[:count], test.labels[:count]


def shuffle_seed(config: Mapping[str, Any], server_round: int, partition_id: int) -> int:
    """The seed of a client's shuffling DataLoader in a round: the run config's seed, the round
    and the partition (fewer than 1,000), so that a rerun shuffles alike and whoever knows the
    app's config knows every client's order."""
    return int(config["seed"]) * 1_000_000 + server_round * 1_000 + partition_id


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: Mapping[str, Any], seed: int) -> float:
    """`local-epochs` passes of SGD with momentum and weight decay over mini-batches of
    `batch-size` (a client with fewer examples takes them all at once), reshuffled every
    epoch by a DataLoader seeded with `seed`; returns the last batch's loss."""
    loader = DataLoader(TensorDataset(x, y), batch_size=int(config["batch-size"]), shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config["lr"]), momentum=float(config["momentum"]),
                                weight_decay=float(config["weight-decay"]))
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(int(config["local-epochs"])):
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
    return float(loss.detach())


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
