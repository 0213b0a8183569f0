"""Attacks: one module per attack, one registry line each."""
from __future__ import annotations

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
})

__all__ = ["ATTACKS", "Attack", "AttackContext", "Reconstruction", "make_attack"]


def make_attack(spec: ComponentSpec | str) -> Attack:
    if isinstance(spec, str):
        spec = parse_spec(spec, "attack")
    cls = ATTACKS.get(spec.name)
    return cls(build_options(cls.Options, spec.options, f"attack '{spec.name}'"))
