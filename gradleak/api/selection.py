"""Attack selection: which attacks run on an audit at a budget preset, and a one-line reason
for each that does not (the threat model's refusal, the data's modality, the architecture, or
another attack that this client's training makes it repeat)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from torch import nn

from ..attacks import ATTACKS, Attack, make_attack
from ..attacks.base import refusal
from ..errors import GradleakError
from ..fl import TrainingSpec
from ..options import ComponentSpec, parse_spec
from ..run.ladder import LADDER_DOUBLINGS
from ..threat import ThreatModel

# Budget presets: "quick" fits a laptop CPU in minutes, "standard" is each
# attack's own defaults, "thorough" spends more iterations or restarts. Each also sets how
# many times the auditor may double an attack's budget while its verdict is undecided.
BUDGETS = ("quick", "standard", "thorough")
BUDGET_DOUBLINGS = {"quick": 2, "standard": LADDER_DOUBLINGS, "thorough": 4}


@dataclass(frozen=True)
class SkippedAttack:
    """An attack that did not run, and why (one line)."""

    attack: str
    reason: str

    @property
    def name(self) -> str:
        """The attack's registered name: `attack` is canonical (`str(ComponentSpec)`), its name
        before the options."""
        return self.attack.partition(":")[0]

    def to_dict(self) -> dict:
        return {"attack": self.attack, "reason": self.reason}



def select_attacks(attacks: str | Sequence[str | Attack], model: nn.Module | None, input_shape: tuple[int, ...],
                   num_classes: int, modality: str, threat: ThreatModel, budget: str = "quick",
                   training: TrainingSpec | None = None, samples: int = 1
                   ) -> tuple[list[str], list[SkippedAttack]]:
    """The attack specs to run and the skipped ones with their reasons.

    `"auto"` considers every registered attack at the `budget` preset; an
    explicit list is taken as given, the preset filling only options it does
    not set. An attack is skipped when the threat model does not grant the
    knowledge it needs, when it does not handle the data's modality, or when
    the architecture lacks what it works on (`Attack.unsupported`; with `model` None, each run
    checks that instead: `check_scenario`); `"auto"` also skips an
    attack that would only repeat another on this client's `training` (`Attack.redundant_for`)."""
    automatic = isinstance(attacks, str) and attacks.strip().lower() == "auto"
    if isinstance(attacks, str):
        attacks = list(ATTACKS.names()) if automatic else [attacks]
    if not attacks:
        raise GradleakError("no attack given (use attacks='auto' for every applicable attack)")
    selected, skipped = [], []
    for item in attacks:
        spec = component_spec(item, "attack")
        preset = ComponentSpec(spec.name, {**budget_options(spec.name, budget), **spec.options})
        text = str(preset)
        attack = make_attack(preset)
        reason = refusal(attack, threat, modality, model, input_shape, num_classes)
        if not reason and automatic and training is not None:
            reason = attack.redundant_for(training, samples)
        if reason:
            skipped.append(SkippedAttack(text, reason))
        else:
            selected.append(text)
    return selected, skipped


def budget_options(name: str, budget: str) -> dict:
    """The options the budget preset `budget` sets for attack `name` (none for "standard")."""
    return dict(getattr(ATTACKS.get(name), "budgets", {}).get(budget, {}))


def check_budget(budget: str) -> None:
    if budget not in BUDGETS:
        raise GradleakError(f"unknown budget '{budget}'; choose from: {', '.join(BUDGETS)}")


def component_text(item: Any, kind: str) -> str:
    """A `name:k=v` string for a spec string or an attack/defense object (its
    options that differ from the defaults)."""
    return str(component_spec(item, kind))


def component_spec(item: Any, kind: str) -> ComponentSpec:
    """A spec string (`audit`'s attacks and defenses), parsed, or an attack/defense object's
    name and its options that differ from the defaults."""
    if isinstance(item, str):
        return parse_spec(item, kind)
    name = getattr(item, "name", None)
    if not name or not hasattr(item, "options"):
        raise GradleakError(f"a {kind} must be a 'name:key=value' string or a gradleak {kind} object, "
                            f"got {type(item).__name__}")
    options = item.options
    values: dict[str, Any] = {}
    if options is not None and dataclasses.is_dataclass(options):
        try:
            defaults = type(options)()  # type: ignore[misc]  # option dataclasses default every field
        except TypeError:
            defaults = None
        for f in dataclasses.fields(options):
            value = getattr(options, f.name)
            if defaults is None or value != getattr(defaults, f.name):
                values[f.name] = _format_option(value)
    return ComponentSpec(name, values)


def _format_option(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ";".join(_format_option(v) for v in value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)
