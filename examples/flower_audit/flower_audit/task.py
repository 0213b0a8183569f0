"""The model, the clients' data and the local training of this Flower app.

Every client holds a Dirichlet(alpha) non-IID share of MNIST (read offline by
gradleak's loader) and, in each round, trains with plain SGD on its
`examples-per-client` examples in a fixed order.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

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
    """This client's training examples, in the order it trains on them."""
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


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, epochs: int, batch_size: int) -> float:
    """Plain SGD over mini-batches in order; returns the last batch's loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        for start in range(0, len(x), batch_size):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[start:start + batch_size]), y[start:start + batch_size])
            loss.backward()
            optimizer.step()
    return float(loss)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
