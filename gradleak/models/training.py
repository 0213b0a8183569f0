"""Short pre-training so attacks can also be run against a trained model.

Gradient leakage differs between freshly initialised and trained networks, so
the benchmark needs a cheap, reproducible way to get the latter on CPU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data.base import Dataset
from ..errors import GradleakError


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def pretrain(model: nn.Module, dataset: Dataset, *, steps: int, lr: float = 0.1, batch_size: int = 64,
             seed: int = 0, device: str = "cpu") -> dict[str, float]:
    """SGD (momentum 0.9) on cross-entropy for `steps` mini-batches, in place.

    Batches are drawn epoch-wise from a local generator seeded with `seed`, so
    the global RNG is untouched and runs repeat exactly. Returns the mean loss
    and accuracy over the last 10 % of steps (at least 1) as a cheap progress
    signal; use `evaluate` for held-out accuracy. The model ends on its
    original device and in its original train/eval mode.
    """
    if steps < 0:
        raise GradleakError(f"pretraining steps must be non-negative (got {steps})")
    if batch_size < 1:
        raise GradleakError(f"pretraining batch size must be at least 1 (got {batch_size})")
    if dataset.samples_only:
        raise GradleakError(
            f"dataset '{dataset.name}' holds only {len(dataset)} sample images: too small to pretrain on"
        )
    if len(dataset) == 0:
        raise GradleakError(f"dataset '{dataset.name}' is empty: nothing to pretrain on")
    home, was_training = _model_device(model), model.training
    model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    generator = torch.Generator().manual_seed(int(seed))
    n, batch_size = len(dataset), min(batch_size, len(dataset))
    order, cursor = torch.randperm(n, generator=generator), 0
    tail = max(1, steps // 10)
    loss_sum, correct, seen = 0.0, 0, 0
    for step in range(steps):
        if cursor + batch_size > n:
            order, cursor = torch.randperm(n, generator=generator), 0
        idx = order[cursor:cursor + batch_size]
        cursor += batch_size
        inputs = dataset.inputs[idx].to(device)
        labels = dataset.labels[idx].to(device).long()
        logits = model(inputs)
        loss = F.cross_entropy(logits, labels)
        if not torch.isfinite(loss):
            raise GradleakError(f"pretraining diverged at step {step} (loss {loss.item()}); lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= steps - tail:
            loss_sum += loss.item() * len(idx)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(idx)
    model.to(home).train(was_training)
    if seen == 0:
        return {"loss": float("nan"), "accuracy": float("nan")}
    return {"loss": loss_sum / seen, "accuracy": correct / seen}


@torch.no_grad()
def evaluate(model: nn.Module, dataset: Dataset, batch_size: int = 512) -> float:
    """Top-1 accuracy in eval mode (BatchNorm uses running statistics); mode restored after."""
    if len(dataset) == 0:
        raise GradleakError(f"dataset '{dataset.name}' is empty: nothing to evaluate on")
    device, was_training = _model_device(model), model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, len(dataset), batch_size):
            inputs = dataset.inputs[start:start + batch_size].to(device)
            labels = dataset.labels[start:start + batch_size].to(device)
            correct += int((model(inputs).argmax(1) == labels).sum())
    finally:
        model.train(was_training)
    return correct / len(dataset)
