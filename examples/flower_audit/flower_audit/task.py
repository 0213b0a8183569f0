"""The model, the clients' data and the local training of this Flower app.

Every client holds a Dirichlet(alpha) non-IID share of MNIST (read offline by
gradleak's loader) and, in each round, trains on its `examples-per-client` examples
as a PyTorch app usually does: a shuffling DataLoader, SGD with momentum and weight
decay, several local epochs.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gradleak.data import DatasetSpec, load_dataset
from gradleak.utility import dirichlet_partition


class Net(nn.Module):
    """A small sigmoid CNN (LeNet-like, as in the gradient-inversion literature)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 12, 5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid())
        self.classifier = nn.Linear(12 * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def initial_model(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def client_data(partition_id: int, num_partitions: int, config) -> tuple[torch.Tensor, torch.Tensor]:
    """This client's training examples, in the order its DataLoader indexes them."""
    train = load_dataset(DatasetSpec("mnist", split="train"))
    seed, alpha = int(config["seed"]), float(config["dirichlet-alpha"])
    shards = dirichlet_partition(train.labels, num_partitions, alpha, seed)
    shard = shards[partition_id]
    order = torch.randperm(len(shard), generator=torch.Generator().manual_seed(seed + partition_id))
    keep = shard[order[: int(config["examples-per-client"])]]
    return train.inputs[keep], train.labels[keep]


def held_out_examples(count: int = 1000) -> torch.Tensor:
    """MNIST test examples (no client trains on the test split)."""
    return load_dataset(DatasetSpec("mnist", split="test")).inputs[:count]


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
