"""Threat models: what the server sees and what it is declared to know.

An `Observation` carries the (defended) update, the model the server sent, and
only the knowledge its threat model grants. Attacks declare what they need; a
threat model that does not grant it refuses the attack before it runs, and
`Observation.get` refuses at access time, so no attack peeks at ground truth.

Some knowledge the server reads off what the client sends rather than is declared to
know: the batch-norm statistics of a batch, from the running statistics a client sends
with its update (`gradleak.fl.buffers`). A threat model `sees` them, under any preset.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from .data.base import DataSignature
from .errors import GradleakError
from .fl.buffers import batchnorm_layers, statistics_from_buffers, why_no_batch_statistics
from .fl.training import TrainingSpec
from .fl.update import Update
from .knowledge import KNOWLEDGE, PRESETS  # noqa: F401  (re-exported: the threat model's vocabulary)
from .modalities import Modality
from .modalities import modality as modality_of


@dataclass(frozen=True)
class ThreatModel:
    name: str
    grants: frozenset[str]
    # what the server reads off the client's update rather than is declared to know (also in
    # `grants`); the name stays the preset's
    sees: frozenset[str] = frozenset()
    # (knowledge, why the update does not carry it) for what a client's update might carry
    unseen: tuple[tuple[str, str], ...] = ()

    def refuses(self, needs: frozenset[str]) -> str | None:
        """Why an attack that needs `needs` cannot run under this threat model (one line, as
        the attack's reason for not running), or None when everything is granted."""
        missing = sorted(needs - self.grants)
        if not missing:
            return None
        why = dict(self.unseen)
        notes = "".join(f" ({key} not from the update: {why[key]})" for key in missing if key in why)
        return f"needs {', '.join(missing)}, which threat model '{self.name}' does not grant{notes}"

    def check(self, attack_name: str, needs: frozenset[str]) -> None:
        """Raise the one-line refusal of `refuses`, with what to add on the command line."""
        reason = self.refuses(needs)
        if reason:
            raise GradleakError(f"attack '{attack_name}' {reason}; add {self.hint(needs)}")

    def hint(self, needs: frozenset[str]) -> str:
        """What to add on the command line for an attack that needs `needs`."""
        missing = sorted(needs - self.grants)
        return "--threat malicious" if "malicious_model" in missing else "--knows " + ",".join(missing)

    def seeing(self, key: str) -> "ThreatModel":
        """This threat model, reading `key` off the update (declared knowledge stays declared)."""
        if key in self.grants:
            return self
        return dataclasses.replace(self, grants=self.grants | {key}, sees=self.sees | {key})

    def not_seeing(self, key: str) -> "ThreatModel":
        """This threat model without `key` where only the update was to give it."""
        if key not in self.sees:
            return self
        return dataclasses.replace(self, grants=self.grants - {key}, sees=self.sees - {key})

    def declares(self, key: str) -> bool:
        """Granted as declared knowledge (which the auditor takes from the ground truth),
        not read off the update."""
        return key in self.grants and key not in self.sees


def expected_view(threat: ThreatModel, training: TrainingSpec, samples: int, clients: int = 1) -> ThreatModel:
    """`threat` as the checks before a run see it: seeing `bn_statistics` when the client
    sends its buffers and they will give its batch's statistics (`gradleak.fl.buffers`),
    otherwise noting why not. `observe` decides for each update, from what it carries."""
    if not training.sends_buffers:
        return threat
    reason = why_no_batch_statistics(training, samples, clients)
    if reason is None:
        return threat.seeing("bn_statistics")
    return dataclasses.replace(threat, unseen=threat.unseen + (("bn_statistics", reason),))


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
    # what the data is, as the dataset or the batch declared it: one example's shape, the classes,
    # the modality (gradleak.modalities) and, for text, the tokenizer of the ids (gradleak.data.text),
    # public as the vocabulary is
    signature: DataSignature
    threat: ThreatModel
    _knowledge: dict[str, Any] = field(default_factory=dict, repr=False)
    # What a malicious server remembers about the model it crafted (its own state, not
    # knowledge about the client); set only under a threat model granting malicious_model.
    server_secrets: Any = field(default=None, repr=False)
    # why knowledge the update might have carried is not in this observation, by key
    unavailable: dict[str, str] = field(default_factory=dict, repr=False)

    def knows(self, key: str) -> bool:
        return key in self.threat.grants and key in self._knowledge

    def get(self, key: str) -> Any:
        if key not in KNOWLEDGE:
            raise KeyError(key)
        why = f" ({self.unavailable[key]})" if key in self.unavailable else ""
        if key not in self.threat.grants:
            raise GradleakError(f"threat model '{self.threat.name}' does not grant '{key}'{why}")
        if key not in self._knowledge:
            raise GradleakError(f"'{key}' is not available in this observation{why}")
        return self._knowledge[key]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.signature.input_shape

    @property
    def num_classes(self) -> int:
        return self.signature.num_classes

    @property
    def modality(self) -> str:
        return self.signature.modality

    @property
    def tokenizer(self) -> str | None:
        return self.signature.tokenizer

    @property
    def batch_size(self) -> int:
        return int(self.get("batch_size"))

    @property
    def kind(self) -> Modality:
        """What the data is (gradleak.modalities): pictures, feature rows or token sequences."""
        return modality_of(self.modality)

    @property
    def training(self) -> TrainingSpec:
        return self.get("local_training")


def observe(update: Update, model: nn.Module, threat: ThreatModel, *, input_shape: tuple[int, ...],
            num_classes: int, training: TrainingSpec, batch_size: int, labels: torch.Tensor,
            defenses: Sequence[Any], modality: str,
            bn_statistics: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
            prior_data: Any = None, server_secrets: Any = None, tokenizer: str | None = None,
            inputs: torch.Tensor | None = None) -> Observation:
    """Build the server's view, keeping only what `threat` grants. `defenses` are
    the client's defenses, as objects or `name:k=v` strings (their names and options
    are what a server that chose the protocol knows). `inputs`, the client's batch, is read
    only for what a threat model declares as granted: the batch-norm statistics of `model` on
    it (`bn_statistics`, unless given). An update that carries batch-norm buffers gives the
    server its batch's statistics when they can be derived exactly (`gradleak.fl.buffers`):
    the observation's threat model then sees `bn_statistics` (unless it declares them), and
    they replace any given from the ground truth."""
    from .defenses import make_defense

    if bn_statistics is None and inputs is not None and threat.declares("bn_statistics"):
        bn_statistics = capture_bn_statistics(model, inputs)
    unavailable: dict[str, str] = {}
    if update.buffers:
        sent = statistics_from_buffers(model, update.buffers, training, update.samples, tuple(input_shape),
                                       update.clients)
        if sent.statistics is not None and batch_size != update.samples:
            sent = dataclasses.replace(sent, statistics=None,
                                       reason="the observed batch is not the batch the buffers were updated on")
        if sent.statistics is not None:
            bn_statistics = sent.statistics
            threat = threat.seeing("bn_statistics")
        else:
            threat = threat.not_seeing("bn_statistics")
            unavailable["bn_statistics"] = f"not derived from the sent buffers: {sent.reason}"

    available = {
        "batch_size": batch_size,
        "local_training": training.server_view(),  # never the seed of a shuffle it cannot replay
        "defenses": tuple(make_defense(d) if isinstance(d, str) else d for d in defenses),
        "labels": labels.clone(),
        "bn_statistics": bn_statistics,
        "prior_data": prior_data,
        "malicious_model": True,
    }
    knowledge = {k: v for k, v in available.items() if k in threat.grants and v is not None}
    secrets = server_secrets if "malicious_model" in threat.grants else None
    return Observation(update, model, DataSignature(tuple(input_shape), num_classes, modality, tokenizer), threat,
                       knowledge, secrets, {k: v for k, v in unavailable.items() if k not in knowledge})


def capture_bn_statistics(model: nn.Module, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-BN-layer (mean, biased var) of the batch x, in module order, without
    touching the model's running statistics."""
    stats: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(_module, inputs, _output):
        h = inputs[0].detach()
        dims = [0] + list(range(2, h.dim()))
        stats.append((h.mean(dims), h.var(dims, unbiased=False)))

    handles = [layer.register_forward_hook(hook) for _, layer in batchnorm_layers(model)]
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
