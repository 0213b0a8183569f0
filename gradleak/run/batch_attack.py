"""One attack on one batch held in memory: the server prepares its model (for a
malicious attack), the client computes its update on (x, y), the server
reconstructs from its observation, and the result is scored against (x, y).

For research scripts and benchmarks that study an attack on chosen examples;
scenarios over datasets, defenses and seeds go through `gradleak.run.experiment`. Both attack and
score through the same pipeline (`experiment.attack_observations`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..attacks import Attack, AttackContext, Reconstruction, make_attack
from ..data.modality import modality_of_tensors
from ..fl import TrainingSpec, compute_update
from ..fl.training import scenario_fields
from ..models.references import build_named_model
from ..threat import make_threat_model, observe
from .experiment import attack_observations
from .scenario.spec import AttackRunSpec


@dataclass
class BatchAttackResult:
    metrics: dict  # summarize(): mse, psnr, ssim, asr, ... (and the attack's iterations)
    aligned: torch.Tensor  # the reconstruction reordered to match x
    reconstruction: Reconstruction
    server_secrets: Any  # what a malicious prepare_model kept (None otherwise)
    reconstruct_seconds: float


def attack_batch(attack: Attack | str, model: str, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 seed: int = 0, threat: str | None = None, training: TrainingSpec | None = None,
                 lpips: Literal["alex", "vgg", "none"] = "none", modality: str | None = None) -> BatchAttackResult:
    """Run `attack` (an Attack or `name:k=v`) against the update of built-in or user
    model `model` (`name[:k=v]`, seeded with `seed`) on the batch (x, y), through the one run
    pipeline (`gradleak.run.experiment.attack_observations`) at the attack's own budget.
    `modality`: what the batch is (gradleak.modalities); default the one its tensors declare
    (`data.modality.modality_of_tensors`: integer (N, T) ids are text, (N, H, W) and
    (N, C, H, W) images, other shapes tabular rows), as a user's own tensors do."""
    label = attack if isinstance(attack, str) else attack.name
    attack = make_attack(attack) if isinstance(attack, str) else attack
    modality = modality or modality_of_tensors(x)
    input_shape = tuple(x.shape[1:])
    net = build_named_model(model, input_shape, num_classes, seed, modality=modality)
    ctx = AttackContext(seed=seed)
    secrets = None
    if attack.malicious:
        prepared = attack.prepare_model(net, input_shape, num_classes, ctx)
        net, secrets = prepared.model, prepared.secrets
    training = training or TrainingSpec()
    update = compute_update(net, x, y, training, modality=modality)
    threat_model = make_threat_model(threat or ("malicious" if attack.malicious else "honest"))
    threat_model.check(attack.name, attack.needs())
    obs = observe(update, net, threat_model, input_shape=input_shape, num_classes=num_classes,
                  training=training, batch_size=x.shape[0], labels=y, defenses=[], modality=modality,
                  server_secrets=secrets, inputs=x)
    spec = AttackRunSpec(dataset="batch", model=model, attack=label, batch_size=x.shape[0],
                         **scenario_fields(training), seed=seed, threat=threat_model.name, lpips=lpips, device="cpu")
    kept: list[Reconstruction] = []
    # the attack's seed is the batch's own `seed`, as the malicious model's preparation above
    result = attack_observations(spec, attack, [(obs, x, y)], None, ctx.device,
                                 attack_seed=lambda run_seed, batch: run_seed, reconstructions=kept)
    return BatchAttackResult(result.metrics, result.reconstructions, kept[0], secrets,
                             result.extras["ladder"]["attack_seconds"])


def one_per_class(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first example of every class present, in class order."""
    first = [int((y == c).nonzero()[0]) for c in y.unique()]
    return x[first], y[first]
