"""Attacks: one module per attack, one registry line each."""
from __future__ import annotations

from ..errors import GradleakError
from ..options import ComponentSpec, build_options, parse_spec
from ..registry import Registry
from .base import Attack, AttackContext, Reconstruction

ATTACKS: Registry = Registry("attack", {
    "ig": "gradleak.attacks.optimization.ig:InvertingGradients",
    "fc-analytic": "gradleak.attacks.analytic.fc_analytic:FCAnalytic",
    "rtf": "gradleak.attacks.malicious.rtf:RobbingTheFed",
    "loki": "gradleak.attacks.malicious.loki:Loki",
    "scale-mia": "gradleak.attacks.malicious.scale_mia:ScaleMIA",
    "fishing": "gradleak.attacks.malicious.fishing:ClassFishing",
    "cpa": "gradleak.attacks.analytic.cpa:CocktailParty",
    "tensor": "gradleak.attacks.analytic.tensor:TensorAttack",
    "mkor": "gradleak.attacks.malicious.mkor:MKOR",
    "dlg": "gradleak.attacks.optimization.dlg:DLG",
    "cpl": "gradleak.attacks.optimization.cpl:CPL",
    "gradinversion": "gradleak.attacks.optimization.gradinversion:GradInversion",
    "feature-prior": "gradleak.attacks.optimization.feature_prior:FeaturePriorAttack",
    "rog": "gradleak.attacks.optimization.rog:ROG",
    "rog-sign": "gradleak.attacks.optimization.rog:ROGSign",
    "fedavg": "gradleak.attacks.optimization.fedavg:FedAvgAttack",
    "fedleak": "gradleak.attacks.optimization.fedleak:FedLeak",
    "learned": "gradleak.attacks.learned.learned:LearnedInverter",
    "dager": "gradleak.attacks.text.dager_attack:DAGER",
    "tag": "gradleak.attacks.text.tag:TAG",
    "lamp": "gradleak.attacks.text.lamp:LAMP",
    "spear": "gradleak.attacks.analytic.spear:SPEAR",
    "dense-vertices": "gradleak.attacks.analytic.dense_vertices:DenseVertices",
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
