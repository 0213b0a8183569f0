"""How a client trains locally (the FL setting an attack is run under)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..options import check

BN_MODES = ("train", "eval")  # batch norm in local training: batch or running statistics


def check_bn_mode(mode: str) -> None:
    """The one check of a batch-norm mode, shared by every spec that takes one."""
    check(mode in BN_MODES, f"--bn-mode must be 'train' or 'eval', got '{mode}'")


@dataclass(frozen=True)
class TrainingSpec:
    """Local training of one client.

    local_steps = 1 with no epochs is FedSGD: the client sends one gradient.
    Otherwise FedAvg: `local_steps` SGD steps (or `local_epochs` passes) over
    mini-batches of `local_batch_size` taken in a fixed cyclic order, and the
    client sends the weight delta. The fixed order is what lets a server that
    knows the local hyper-parameters replay training exactly.

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

    def __post_init__(self) -> None:
        check(self.lr > 0 and math.isfinite(self.lr), f"--lr must be a positive number, got {self.lr}")
        check(self.local_steps >= 1, f"--local-steps must be >= 1, got {self.local_steps}")
        check(self.local_epochs is None or self.local_epochs >= 1,
              f"--local-epochs must be >= 1, got {self.local_epochs}")
        check(self.local_batch_size is None or self.local_batch_size >= 1,
              f"--local-batch-size must be >= 1, got {self.local_batch_size}")
        check_bn_mode(self.batchnorm)

    @property
    def is_fedsgd(self) -> bool:
        return self.local_steps == 1 and self.local_epochs is None and self.local_batch_size is None

    def step_batch_size(self, samples: int) -> int:
        return min(self.local_batch_size or samples, samples)

    def num_steps(self, samples: int) -> int:
        if self.local_epochs is not None:
            return self.local_epochs * math.ceil(samples / self.step_batch_size(samples))
        return self.local_steps

    def step_indices(self, samples: int) -> list[tuple[int, ...]]:
        """Example indices of every local step, cycling through the data in order."""
        b = self.step_batch_size(samples)
        return [tuple((s * b + j) % samples for j in range(b)) for s in range(self.num_steps(samples))]
