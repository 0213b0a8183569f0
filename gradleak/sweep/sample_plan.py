"""The sample ladder's plan: what the next rung asks for where a verdict is still open.

From the verdict entries (`gradleak.analysis.verdict`: `open`, `ladder_have`, `ladder_needed`,
`ladder_attacks`) it decides how many examples per attack a rung aims at (`leakage.sample_target`:
at least double, as many as the rates need, never past the cap), which attacks it extends, on
which seeds (`rung_seed`) and in how many whole batches each new run attacks (`examples_per_run`).
A sweep plans one target per open verdict and turns it into store cells
(`gradleak.sweep.samples`); `gradleak.audit`, which attacks one setting, plans the open verdicts
of its setting together (`setting_target`) and runs its seeds again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from ..leakage import SAMPLE_SEED_OFFSET, sample_target


@dataclass(frozen=True)
class RungTarget:
    """What an open verdict (or a setting's open verdicts together) asks of the next rung."""

    have: int  # examples the verdict was judged on (at least 1)
    target: int  # examples per attack the rung aims at
    attacks: frozenset[str] | None  # the attack specs it extends; None: every one the verdict rests on
    threat: str | None = None  # the verdict's threat model (None for a setting's verdicts together)

    @property
    def missing(self) -> int:
        return self.target - self.have


def verdict_target(entry: dict, max_examples: int) -> RungTarget | None:
    """The next rung's target for one verdict entry; None when it is decided or at the cap."""
    if not entry.get("open"):
        return None
    return _target(max(1, entry["ladder_have"]), entry["ladder_needed"], [entry.get("ladder_attacks")],
                   max_examples, str(entry["threat"]))


def every_attack_target(entry: dict, max_examples: int) -> RungTarget | None:
    """The last rung's target for every attack an open verdict rests on, beside its focused
    one (`verdict_target`): from the fewest examples any was judged on towards what the most
    wanting needs. A focused rung extends only the attack measuring at or above the tolerance;
    with no rung after the last, a focused attack that comes below the tolerance there would
    leave the verdict "not shown" for the others' want of examples (a calibration probe: IG
    left at 8 examples, bounded to 0.73, beside CPL and ROG at 192 that held)."""
    if not entry.get("open"):
        return None
    return _target(*_every_attack_span(entry), [None], max_examples, str(entry["threat"]))


def _every_attack_span(entry: dict) -> tuple[int, int]:
    """From how many examples, towards how many, every attack of a verdict is extended: its
    least-examined attack's count, and what the most wanting one needs (the focused one's
    `ladder_needed`, the others' `needed_examples`)."""
    return max(1, entry["min_examples"]), max(entry["ladder_needed"], entry["needed_examples"])


def setting_target(entries: Iterable[dict], max_examples: int, last: bool = False) -> RungTarget | None:
    """One target for the open verdicts of one setting together (an audit's): from the fewest
    examples any was judged on towards the most any needs, for the attacks they name (every
    attack when one names none, or on the `last` rung: `every_attack_target`); None when none
    is open or nothing is to be added."""
    open_entries = [e for e in entries if e.get("open")]
    if not open_entries:
        return None
    if last:
        spans = [_every_attack_span(e) for e in open_entries]
        return _target(min(have for have, _ in spans), max(needed for _, needed in spans), [None], max_examples, None)
    return _target(max(1, min(e["ladder_have"] for e in open_entries)),
                   max(e["ladder_needed"] for e in open_entries),
                   [e.get("ladder_attacks") for e in open_entries], max_examples, None)


def _target(have: int, needed: int, named: list, max_examples: int, threat: str | None) -> RungTarget | None:
    target = sample_target(have, needed, max_examples)
    if target <= have:
        return None
    attacks = None if any(not n for n in named) else frozenset(a for n in named for a in n)
    return RungTarget(have, target, attacks, threat)


def examples_per_run(missing: int, runs: int, batch_size: int) -> int:
    """Examples each of `runs` new runs attacks so that together they add `missing`: whole
    batches, rounded up."""
    return math.ceil(missing / runs / batch_size) * batch_size


def rung_seed(seed: int, rung: int) -> int:
    """The seed that run `seed` is repeated on at sample rung `rung`: new examples, new defense
    noise, a new initialisation of the model."""
    return seed + SAMPLE_SEED_OFFSET * rung
