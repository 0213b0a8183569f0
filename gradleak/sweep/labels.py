"""How a cell is named in tables: dataset, model, defense chain and strength, attack."""
from __future__ import annotations

from typing import Sequence

from ..options import ComponentSpec
from ..run.experiment import AttackRunSpec


def is_dataset_path(text: str) -> bool:
    from ..data.references import dataset_path_form

    return dataset_path_form(text) is not None


def defense_label(defenses: Sequence[ComponentSpec]) -> str:
    return "+".join(d.name for d in defenses) or "none"


def strength_label(defenses: Sequence[ComponentSpec]) -> str:
    parts = [f"{k}={v}" for d in defenses for k, v in d.options.items()]
    return ",".join(parts) or "default" if defenses else ""


def chain_labels(defenses: Sequence[ComponentSpec]) -> dict[str, str]:
    """A defense chain's `defense` and `strength` labels."""
    return {"defense": defense_label(defenses), "strength": strength_label(defenses)}


def dataset_label(text: str) -> str:
    """A dataset's name for tables: the registry name, or the path as given."""
    from ..data.references import reference_label

    return reference_label(text)


def local_steps(spec: AttackRunSpec) -> int:
    """The optimizer steps the client took: epochs × mini-batches when it trains in epochs (the
    report's "batch 400, 13 local step(s)" for one epoch of batches of 32)."""
    return spec.training().num_steps(spec.batch_size)


def attack_labels(spec: AttackRunSpec) -> dict:
    from ..threat import make_threat_model

    attack = spec.attack_spec
    return {"threat": make_threat_model(spec.threat, spec.knows).name,
            "dataset": dataset_label(spec.dataset), "model": spec.model,
            "batch_size": spec.batch_size, "local_steps": local_steps(spec), "seed": spec.seed,
            **chain_labels(spec.defense_specs),
            "defenses": list(spec.defenses), "attack": attack.name, "attack_spec": str(attack),
            "init": attack.options.get("init")}
