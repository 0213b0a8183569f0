"""The places in a client's round where a defense can act, as the client sees them.

The client (`compute_update`) calls these hooks in the order a deployment meets
them: the batch before training, every local step's gradient, the final update.
`gradleak.defenses.DefenseChain` implements them; the client needs nothing else
from the defenses package, so the dependency runs one way (defenses → fl).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .local import StepGradient
from .training import TrainingSpec
from .update import Update


@dataclass
class DefenseContext:
    generator: torch.Generator
    state: dict = field(default_factory=dict)  # per-client memory across rounds
    training: TrainingSpec | None = None
    model: nn.Module | None = None

    @property
    def label_smoothing(self) -> float:
        """The client's label smoothing, for defenses that compute their own loss."""
        return self.training.label_smoothing if self.training is not None else 0.0


class NoDefense:
    """The hooks of a client that applies no defense."""

    def transform_batch(self, x: torch.Tensor, y: torch.Tensor, ctx: DefenseContext):
        return x, y

    def step_gradient(self, inner: StepGradient, ctx: DefenseContext) -> StepGradient:
        return inner

    def transform_update(self, update: Update, ctx: DefenseContext) -> Update:
        return update
