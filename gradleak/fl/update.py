"""`Update`: the named tensors a client sends, plus what describes them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from ..errors import GradleakError

UpdateKind = Literal["gradient", "delta"]

@dataclass
class Update:
    """Named parameter-shaped tensors and their provenance.

    kind "gradient": FedSGD, the mean-loss gradient of one batch.
    kind "delta": FedAvg, `w_start - w_end` after local training, so one SGD step
    with learning rate lr gives `lr * gradient` (same sign as a gradient).
    """

    tensors: dict[str, torch.Tensor]
    kind: UpdateKind
    lr: float
    steps: int
    batch_size: int  # examples per local step
    samples: int  # examples the client trained on
    clients: int = 1
    epochs: int | None = None
    meta: dict = field(default_factory=dict)
    # The model's buffers after local training (batch-norm running mean/var,
    # num_batches_tracked), by state-dict name, when the client sends them (a Flower client
    # returns its whole state dict); empty when it sends parameters only. Defenses act on
    # `tensors`; the buffers travel as sent.
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    def replace(self, **changes) -> "Update":
        return dataclasses.replace(self, **changes)

    def map(self, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> "Update":
        return self.replace(tensors={k: fn(k, v) for k, v in self.tensors.items()})

    def flat(self) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in self.tensors.values()])

    def from_flat(self, vector: torch.Tensor) -> "Update":
        out, offset = {}, 0
        for name, tensor in self.tensors.items():
            n = tensor.numel()
            out[name] = vector[offset:offset + n].view_as(tensor)
            offset += n
        return self.replace(tensors=out)

    def norm(self) -> float:
        return float(self.flat().norm())

    def check_finite(self) -> None:
        for name, tensor in self.tensors.items():
            if not torch.isfinite(tensor).all():
                raise GradleakError(f"update tensor '{name}' contains NaN or infinity")

    def as_gradient(self) -> dict[str, torch.Tensor]:
        """Rough gradient equivalent: a delta divided by lr × steps."""
        if self.kind == "gradient":
            return self.tensors
        scale = 1.0 / (self.lr * max(self.steps, 1))
        return {k: v * scale for k, v in self.tensors.items()}


def check_update_fits(model: torch.nn.Module, update: Update) -> None:
    """One line when `update` does not fit `model`: a tensor that is not one of its parameters,
    a shape that differs, or sent buffers the model does not hold."""
    from .buffers import check_sent_buffers

    check_sent_buffers(model, update.buffers)
    params = dict(model.named_parameters())
    unknown = [n for n in update.tensors if n not in params]
    if unknown:
        raise GradleakError(f"update tensor '{unknown[0]}' is not a parameter of the model")
    for name, tensor in update.tensors.items():
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise GradleakError(f"update tensor '{name}' has shape {tuple(tensor.shape)}, "
                                f"the model's parameter {tuple(params[name].shape)}")
