"""Threat models: what the server sees and what it is declared to know.

An `Observation` carries the (defended) update, the model the server sent, and
only the knowledge its threat model grants. Attacks declare what they need; a
threat model that does not grant it refuses the attack before it runs, and
`Observation.get` refuses at access time, so no attack peeks at ground truth.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from .errors import GradleakError
from .fl.training import TrainingSpec
from .fl.update import Update
from .knowledge import KNOWLEDGE, PRESETS  # noqa: F401  (re-exported: the threat model's vocabulary)


@dataclass(frozen=True)
class ThreatModel:
    name: str
    grants: frozenset[str]

    def check(self, attack_name: str, needs: frozenset[str]) -> None:
        missing = sorted(needs - self.grants)
        if missing:
            hint = ("--threat malicious" if "malicious_model" in missing
                    else "--knows " + ",".join(missing))
            raise GradleakError(
                f"attack '{attack_name}' needs {', '.join(missing)}, which threat model "
                f"'{self.name}' does not grant; add {hint}")


def make_threat_model(name: str = "honest", extra: tuple[str, ...] | list[str] = ()) -> ThreatModel:
    if name not in PRESETS:
        raise GradleakError(f"unknown threat model '{name}'; choose from: {', '.join(PRESETS)}")
    unknown = [k for k in extra if k not in KNOWLEDGE]
    if unknown:
        raise GradleakError(f"unknown knowledge '{unknown[0]}'; choose from: {', '.join(KNOWLEDGE)}")
    grants = PRESETS[name] | frozenset(extra)
    label = name if not extra else f"{name}+{'+'.join(sorted(extra))}"
    return ThreatModel(label, grants)


@dataclass
class Observation:
    """What the server has when it attacks one client update."""

    update: Update
    model: nn.Module  # the model the server sent (attacks must not modify it)
    input_shape: tuple[int, ...]
    num_classes: int
    threat: ThreatModel
    modality: str = "image"
    _knowledge: dict[str, Any] = field(default_factory=dict, repr=False)
    # What a malicious server remembers about the model it crafted (its own state, not
    # knowledge about the client); set only under a threat model granting malicious_model.
    server_secrets: Any = field(default=None, repr=False)

    def knows(self, key: str) -> bool:
        return key in self.threat.grants and key in self._knowledge

    def get(self, key: str) -> Any:
        if key not in KNOWLEDGE:
            raise KeyError(key)
        if key not in self.threat.grants:
            raise GradleakError(f"threat model '{self.threat.name}' does not grant '{key}'")
        if key not in self._knowledge:
            raise GradleakError(f"'{key}' is not available in this observation")
        return self._knowledge[key]

    @property
    def batch_size(self) -> int:
        return int(self.get("batch_size"))

    @property
    def training(self) -> TrainingSpec:
        return self.get("local_training")


def observe(update: Update, model: nn.Module, threat: ThreatModel, *, input_shape: tuple[int, ...],
            num_classes: int, training: TrainingSpec, batch_size: int, labels: torch.Tensor,
            defenses: Sequence[Any], modality: str = "image",
            bn_statistics: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
            prior_data: Any = None, server_secrets: Any = None) -> Observation:
    """Build the server's view, keeping only what `threat` grants. `defenses` are
    the client's defenses, as objects or `name:k=v` strings (their names and options
    are what a server that chose the protocol knows)."""
    from .defenses import make_defense

    available = {
        "batch_size": batch_size,
        "local_training": training,
        "defenses": tuple(make_defense(d) if isinstance(d, str) else d for d in defenses),
        "labels": labels.clone(),
        "bn_statistics": bn_statistics,
        "prior_data": prior_data,
        "malicious_model": True,
    }
    knowledge = {k: v for k, v in available.items() if k in threat.grants and v is not None}
    secrets = server_secrets if "malicious_model" in threat.grants else None
    return Observation(update, model, tuple(input_shape), num_classes, threat, modality, knowledge, secrets)


def capture_bn_statistics(model: nn.Module, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-BN-layer (mean, biased var) of the batch x, in module order, without
    touching the model's running statistics."""
    stats: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(_module, inputs, _output):
        h = inputs[0].detach()
        dims = [0] + list(range(2, h.dim()))
        stats.append((h.mean(dims), h.var(dims, unbiased=False)))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not handles:
        return []
    saved = {n: b.clone() for n, b in model.named_buffers()}
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
        for n, b in model.named_buffers():
            b.copy_(saved[n])
    return stats
