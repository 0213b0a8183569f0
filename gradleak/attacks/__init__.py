"""Attacks: one module per attack, one registry line each."""
from __future__ import annotations

from ..errors import GradleakError
from ..options import ComponentSpec, build_options, parse_spec
from ..registry import Registry
from .base import Attack, AttackContext, Reconstruction

ATTACKS: Registry = Registry("attack", {
    "ig": "gradleak.attacks.ig:InvertingGradients",
    "fc-analytic": "gradleak.attacks.fc_analytic:FCAnalytic",
    "rtf": "gradleak.attacks.rtf:RobbingTheFed",
    "fishing": "gradleak.attacks.fishing:ClassFishing",
    "cpa": "gradleak.attacks.cpa:CocktailParty",
    "tensor": "gradleak.attacks.tensor:TensorAttack",
    "mkor": "gradleak.attacks.mkor:MKOR",
    "dlg": "gradleak.attacks.dlg:DLG",
    "cpl": "gradleak.attacks.cpl:CPL",
    "gradinversion": "gradleak.attacks.gradinversion:GradInversion",
    "feature-prior": "gradleak.attacks.feature_prior:FeaturePriorAttack",
    "rog": "gradleak.attacks.rog:ROG",
    "rog-sign": "gradleak.attacks.rog:ROGSign",
    "fedavg": "gradleak.attacks.fedavg:FedAvgAttack",
    "learned": "gradleak.attacks.learned:LearnedInverter",
    "dager": "gradleak.attacks.dager_attack:DAGER",
    "tag": "gradleak.attacks.tag:TAG",
    "lamp": "gradleak.attacks.lamp:LAMP",
    "spear": "gradleak.attacks.spear:SPEAR",
})

__all__ = ["ATTACKS", "Attack", "AttackContext", "Reconstruction", "make_attack"]


def make_attack(spec: ComponentSpec | str) -> Attack:
    if isinstance(spec, str):
        spec = parse_spec(spec, "attack")
    cls = ATTACKS.get(spec.name)
    return cls(build_options(cls.Options, with_preset(cls, spec), f"attack '{spec.name}'"))


def with_preset(cls: type[Attack], spec: ComponentSpec) -> dict:
    """The spec's options over those of the preset it names (`ig:preset=fast,restarts=3`):
    a preset is a named set of defaults measured together (docs/optimization-attacks.md)."""
    options = dict(spec.options)
    name = options.pop("preset", None)
    if name is None:
        return options
    presets = getattr(cls, "presets", {})
    if not presets:
        raise GradleakError(f"attack '{spec.name}' has no presets")
    if str(name) not in presets:
        raise GradleakError(f"attack '{spec.name}' has no preset '{name}'; choose from: {', '.join(presets)}")
    return {**presets[str(name)], **options}
