"""Defenses: one module per defense, one registry line each."""
from __future__ import annotations

from ..options import ComponentSpec, build_options, parse_spec
from ..registry import Registry
from .base import Defense, DefenseChain, DefenseContext

DEFENSES: Registry = Registry("defense", {
    "noise": "gradleak.defenses.noise:GaussianNoise",
    "clip": "gradleak.defenses.clip:UpdateClipping",
    "laplace": "gradleak.defenses.laplace:LaplaceNoise",
    "dpsgd": "gradleak.defenses.dpsgd:DPSGD",
    "fedcdp": "gradleak.defenses.fedcdp:FedCDP",
    "dropout": "gradleak.defenses.dropout:Dropout",
    "prune": "gradleak.defenses.prune:GradientPruning",
    "topk": "gradleak.defenses.topk:TopK",
    "dgc": "gradleak.defenses.dgc:DGC",
    "quantize": "gradleak.defenses.quantize:Quantize",
    "qsgd": "gradleak.defenses.qsgd:QSGD",
    "sign": "gradleak.defenses.sign:SignSGD",
    "secagg": "gradleak.defenses.secagg:SecureAggregation",
    "soteria": "gradleak.defenses.soteria:Soteria",
    "precode": "gradleak.defenses.precode:Precode",
    "mixup": "gradleak.defenses.mixup:Mixup",
    "instahide": "gradleak.defenses.instahide:InstaHide",
})

__all__ = ["DEFENSES", "Defense", "DefenseChain", "DefenseContext", "make_defense", "make_chain"]


def make_defense(spec: ComponentSpec | str) -> Defense:
    if isinstance(spec, str):
        spec = parse_spec(spec, "defense")
    cls = DEFENSES.get(spec.name)
    options = build_options(cls.Options, spec.options, f"defense '{spec.name}'")
    return cls(options)


def make_chain(specs) -> DefenseChain:
    return DefenseChain([make_defense(s) for s in specs or ()])
