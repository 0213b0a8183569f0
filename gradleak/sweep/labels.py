"""How a cell is named in tables: dataset, model, defense chain and strength, attack."""
from __future__ import annotations

from ..options import parse_spec
from ..run.experiment import AttackRunSpec


def is_dataset_path(text: str) -> bool:
    from ..data.references import dataset_path_form

    return dataset_path_form(text) is not None


def defense_label(defenses) -> str:
    return "+".join(parse_spec(d, "defense").name for d in defenses) or "none"


def strength_label(defenses) -> str:
    parts = []
    for d in defenses:
        spec = parse_spec(d, "defense")
        parts += [f"{k}={v}" for k, v in spec.options.items()]
    return ",".join(parts) or "default" if defenses else ""


def dataset_label(text: str) -> str:
    """A dataset's name for tables: the registry name, or the path as given."""
    return text.strip() if is_dataset_path(text) else parse_spec(text, "dataset").name


def local_steps(spec: AttackRunSpec) -> int:
    """The optimizer steps the client took: epochs × mini-batches when it trains in epochs (the
    report's "batch 400, 13 local step(s)" for one epoch of batches of 32)."""
    return spec.training().num_steps(spec.batch_size)


def attack_labels(spec: AttackRunSpec) -> dict:
    from ..threat import make_threat_model

    attack = parse_spec(spec.attack, "attack")
    return {"threat": make_threat_model(spec.threat, spec.knows).name,
            "dataset": dataset_label(spec.dataset), "model": spec.model,
            "batch_size": spec.batch_size, "local_steps": local_steps(spec), "seed": spec.seed,
            "defense": defense_label(spec.defenses), "strength": strength_label(spec.defenses),
            "defenses": list(spec.defenses), "attack": attack.name, "attack_spec": str(attack),
            "init": attack.options.get("init")}
