"""The guard's configuration and its defense ladder, checked before any round.

A ladder is a list of rungs, weakest first; a rung is one defense or a chain of defenses
(`gradleak.defenses`), written as the CLI writes a defense (`noise:sigma=0.01`), a chain's
defenses joined by `+` (`clip:bound=1+noise:sigma=0.01`). In one text (a Flower run
config) the rungs are separated by `;`. Every rung must be stronger than the one below:
the same defenses in the same order, each at least as strong on its strength option
(each defense's `strength`, `Defense.strength_axis`) and one of them strictly stronger; a
defense without a strength option must keep its options.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

from ..defenses import DefenseChain, make_chain
from ..errors import GradleakError
from ..leakage import Tolerance, parse_tolerance
from ..options import ComponentSpec, options_dict, parse_spec

DEFAULT_LADDER = ("noise:sigma=0.0001", "noise:sigma=0.001", "noise:sigma=0.01")
ON_CRAFTED = ("refuse", "safe_copy")


@dataclass(frozen=True)
class Rung:
    """One rung: its text and the defense chain it builds."""

    text: str
    specs: tuple[ComponentSpec, ...]

    def chain(self) -> DefenseChain:
        return make_chain(self.specs)

    @property
    def acts_in_training(self) -> bool:
        """Whether a defense of this rung acts before the final update (data, every step's
        gradient, the model): the client then retrains with it, which needs its training."""
        return self.chain().acts_in_training


@dataclass
class GuardConfig:
    """tolerance:   the verdict's tolerance (`gradleak.leakage.Tolerance`, or its text
                 "linkage=0.6,recognizable=0.1,level=0.95"; None: that default): an update
                 leaks when an attack copies an example or its recognizable rate or linkage
                 AUC, as measured, is above it (gradleak.guard.outbound, docs/guard.md);
    ladder:      the defense rungs, weakest first (texts, or one text with `;` between rungs);
    time_budget: seconds the outbound audit may spend per round (per rung checked);
    every:       audit the outgoing update every k-th round (1: every round); between audits
                 the last chosen rung is applied unaudited (nothing is sent when the last audit
                 withheld the update);
    growth:      between those audits, a round is audited anyway when it trained on fewer
                 examples, or, under a rung that adds a defense, its update's norm is above this
                 multiple of the norm at the last audit: more signal under the same rung's noise
                 may leak where the last audit's did not (the guard's cheap screen of every
                 round; 0: off);
    drift:       between those audits, a round is audited anyway when the received model moved
                 by more than this share of its norm since the last audited round: the same
                 update leaks differently through another model (0: off); not after a decisive
                 audit (each grade held at the tolerance's level), which waits for the next
                 scheduled one;
    start:       where an audit starts climbing: "bottom" (the update as trained, then each rung
                 in turn) or "last" (the rung chosen at the last audit: fewer audits per round,
                 but the guard never steps back down);
    on_crafted:  "refuse" (train nothing this round) or "safe_copy" (train the last model that
                 passed the inbound checks instead);
    attacks:     "auto" (the cheap analytic attacks that apply, then `strongest`) or a list;
    strongest:   the attack run after the analytic ones at the small budget;
    budget:      the attacks' budget preset (gradleak.api.BUDGETS);
    log:         path of the JSON-lines decision log (None: no file);
    withhold_reply: how a Flower client says it sends nothing: "error" (a Flower error reply,
                 which stock strategies skip) or "metrics" (a reply with no arrays and a metric
                 saying why, for strategies that accept one).
    """

    tolerance: Tolerance | str | None = None
    ladder: Sequence[str] | str = DEFAULT_LADDER
    time_budget: float = 60.0
    every: int = 1
    growth: float = 1.25
    drift: float = 0.05
    start: Literal["bottom", "last"] = "bottom"
    on_crafted: Literal["refuse", "safe_copy"] = "refuse"
    attacks: str | Sequence[str] = "auto"
    strongest: tuple[str, ...] = ("ig:iterations=300", "tag:iterations=100")
    budget: str = "quick"
    log: str | None = None
    withhold_reply: Literal["error", "metrics"] = "error"
    seed: int = 0
    rungs: tuple[Rung, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if isinstance(self.tolerance, (bool, int, float)):  # the share of examples of earlier versions
            raise GradleakError(f"guard: tolerance must be the verdict's, e.g. "
                                f"linkage=0.6,recognizable=0.1,level=0.95; got {self.tolerance!r}")
        try:
            self.tolerance = parse_tolerance(self.tolerance)
        except GradleakError as exc:
            raise GradleakError(f"guard: {exc}") from None
        if isinstance(self.time_budget, bool) or not isinstance(self.time_budget, (int, float)) \
                or not math.isfinite(self.time_budget) or not self.time_budget > 0:
            raise GradleakError(f"guard: time_budget must be a positive number of seconds, got {self.time_budget!r}")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise GradleakError(f"guard: every must be a whole number of rounds >= 1, got {self.every!r}")
        if isinstance(self.growth, bool) or not isinstance(self.growth, (int, float)) \
                or not math.isfinite(self.growth) or (self.growth != 0 and self.growth < 1):
            raise GradleakError(f"guard: growth must be 0 (off) or a factor >= 1, got {self.growth!r}")
        if isinstance(self.drift, bool) or not isinstance(self.drift, (int, float)) \
                or not math.isfinite(self.drift) or self.drift < 0:
            raise GradleakError(f"guard: drift must be a share >= 0 (0: off), got {self.drift!r}")
        if self.start not in ("bottom", "last"):
            raise GradleakError(f"guard: start must be 'bottom' or 'last', got {self.start!r}")
        if self.on_crafted not in ON_CRAFTED:
            raise GradleakError(f"guard: on_crafted must be one of {', '.join(ON_CRAFTED)}, got {self.on_crafted!r}")
        if self.withhold_reply not in ("error", "metrics"):
            raise GradleakError(f"guard: withhold_reply must be 'error' or 'metrics', got {self.withhold_reply!r}")
        from ..api import BUDGETS

        if self.budget not in BUDGETS:
            raise GradleakError(f"guard: budget must be one of {', '.join(BUDGETS)}, got {self.budget!r}")
        self.rungs = parse_ladder(self.ladder)
        if isinstance(self.attacks, str) and self.attacks.strip().lower() != "auto":
            self.attacks = [self.attacks]
        if not isinstance(self.attacks, str):
            self.attacks = [str(a).strip() for a in self.attacks if str(a).strip()]
            if [a.lower() for a in self.attacks] in ([], ["auto"]):
                self.attacks = "auto"
        self.strongest = tuple(self.strongest)
        _check_attacks(([] if self.attacks == "auto" else list(self.attacks)) + list(self.strongest))


def _check_attacks(texts: list[str]) -> None:
    """Every attack the guard may run exists and takes its options (one line if not)."""
    from ..attacks import make_attack

    for text in texts:
        try:
            make_attack(text)
        except GradleakError as exc:
            raise GradleakError(f"guard: attack '{text}': {exc}") from None


def parse_ladder(ladder: Sequence[str] | str) -> tuple[Rung, ...]:
    """The rungs of a ladder, checked: known defenses, valid options, increasing strength."""
    texts = [t.strip() for t in ladder.split(";")] if isinstance(ladder, str) else [str(t).strip() for t in ladder]
    texts = [t for t in texts if t]
    if not texts:
        raise GradleakError("guard: the defense ladder is empty; give at least one rung (e.g. noise:sigma=0.01)")
    rungs = []
    for number, text in enumerate(texts, 1):
        specs = tuple(parse_spec(part, "defense") for part in text.split("+") if part.strip())
        try:
            chain = make_chain(specs)
        except GradleakError as exc:
            raise GradleakError(f"guard: ladder rung {number} ({text}): {exc}") from None
        if "secagg" in chain.names:
            raise GradleakError(f"guard: ladder rung {number} ({text}): secure aggregation is the server's "
                                "protocol, not something one client applies to its update")
        rungs.append(Rung(text, specs))
    for number in range(1, len(rungs)):
        why = _not_stronger(rungs[number - 1], rungs[number])
        if why:
            raise GradleakError(f"guard: the ladder is not increasing at rung {number + 1} "
                                f"({rungs[number].text} after {rungs[number - 1].text}): {why}")
    return tuple(rungs)


def _not_stronger(lower: Rung, upper: Rung) -> str | None:
    low, high = lower.chain(), upper.chain()
    if low.names != high.names:
        return "every rung must chain the same defenses in the same order"
    stronger = False
    for a, b in zip(low, high):
        before, after = options_dict(a.options), options_dict(b.options)
        axis = a.strength_axis()
        if axis is None or b.strength_axis() != axis:
            if before != after:
                return f"'{a.name}' has no strength order; keep its options on every rung"
            continue
        option, sign = axis
        rest_before = {k: v for k, v in before.items() if k != option}
        rest_after = {k: v for k, v in after.items() if k != option}
        if rest_before != rest_after:
            return f"'{a.name}' may change only its {option} from rung to rung"
        step = sign * (after[option] - before[option])
        if step < 0:
            return f"'{a.name}' {option} goes from {before[option]} to {after[option]}, a weaker setting"
        stronger |= step > 0
    return None if stronger else "it is no stronger than the rung below"
