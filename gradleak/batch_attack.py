"""One attack on one batch held in memory: the server prepares its model (for a
malicious attack), the client computes its update on (x, y), the server
reconstructs from its observation, and the result is scored against (x, y).

For research scripts and benchmarks that study an attack on chosen examples;
scenarios over datasets, defenses and seeds go through `gradleak.experiment`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .attacks import Attack, AttackContext, Reconstruction, make_attack
from .fl import TrainingSpec, compute_update
from .metrics.scoring import score_batch, summarize
from .models.references import build_named_model
from .threat import make_threat_model, observe


@dataclass
class BatchAttackResult:
    metrics: dict  # summarize(): mse, psnr, ssim, asr, ...
    aligned: torch.Tensor  # the reconstruction reordered to match x
    reconstruction: Reconstruction
    server_secrets: Any  # what a malicious prepare_model kept (None otherwise)
    reconstruct_seconds: float


def attack_batch(attack: Attack | str, model: str, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 seed: int = 0, threat: str | None = None, training: TrainingSpec | None = None,
                 lpips: Literal["alex", "vgg", "none"] = "none") -> BatchAttackResult:
    """Run `attack` (an Attack or `name:k=v`) against the update of built-in or user
    model `model` (`name[:k=v]`, seeded with `seed`) on the batch (x, y)."""
    attack = make_attack(attack) if isinstance(attack, str) else attack
    input_shape = tuple(x.shape[1:])
    net = build_named_model(model, input_shape, num_classes, seed)
    ctx = AttackContext(seed=seed)
    secrets = None
    if attack.malicious:
        prepared = attack.prepare_model(net, input_shape, num_classes, ctx)
        net, secrets = prepared.model, prepared.secrets
    training = training or TrainingSpec()
    update = compute_update(net, x, y, training)
    threat_model = make_threat_model(threat or ("malicious" if attack.malicious else "honest"))
    threat_model.check(attack.name, attack.needs())
    obs = observe(update, net, threat_model, input_shape=input_shape, num_classes=num_classes,
                  training=training, batch_size=x.shape[0], labels=y, defenses=[], server_secrets=secrets)
    start = time.perf_counter()
    rec = attack.reconstruct(obs, ctx)
    seconds = time.perf_counter() - start
    scores, aligned = score_batch(x, y, rec.inputs, rec.labels, lpips=lpips)
    return BatchAttackResult(summarize(scores), aligned, rec, secrets, seconds)


def one_per_class(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first example of every class present, in class order."""
    first = [int((y == c).nonzero()[0]) for c in y.unique()]
    return x[first], y[first]
