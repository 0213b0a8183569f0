"""Defense calibration by search: the weakest setting of one defense family that holds, bracketed
within a factor, instead of a fixed grid that leaves the frontier somewhere in a factor of 10.

The family is a defense with its base options and the option that orders its strength
(`Defense.strength`: noise's σ, DP-SGD's noise multiplier, pruning's ratio). A sweep file gives
the scenario and the attacks (its grids; their defenses and its utility runs are replaced); each
probed value is one sweep of that family's one setting run into the study's store, so every probe
climbs the budget and sample ladders as a sweep does, a probe already stored is not run again,
and an interrupted search resumes where it stopped. The search bisects in log space between a
value that does not hold and one that holds, assuming a stronger setting holds where a weaker
one does (it checks the order on every value it probed and reports a violation).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from ..errors import GradleakError
from ..options import ComponentSpec, parse_spec
from .spec import Sweep, parse_sweep

# A probe's cap on examples per attack, in multiples of the study's. A larger cap decides more
# probes but does not make two seed sets agree, since the frontier moves with the model's
# initialisation (docs/sweeps-and-report.md), so the cheaper cap stays.
PROBE_EXAMPLES_FACTOR = 2

# The seeds a study needs for another seed set to reproduce its bracket: the frontier moves with
# the model's initialisation, and a study's seeds are its initialisations (the sample ladder's
# runs repeat them), so with few seeds the frontier is placed only to about one probe step
# (docs/sweeps-and-report.md).
STUDY_SEEDS = 16


@dataclass
class Probe:
    value: float
    verdict: str  # the setting's verdict: "holds", "leaks", "linkable", "not shown ..."
    text: str
    epsilon: float | None = None  # a DP family's ε for the audited update (one round, δ = 1e-5)

    @property
    def holds(self) -> bool:
        return self.verdict == "holds"


@dataclass
class Calibration:
    defense: str  # the family: name and base options
    option: str
    stronger: int  # +1: a larger value is stronger
    factor: float
    probes: list[Probe] = field(default_factory=list)
    weakest_holding: float | None = None  # the bracket: holds here ...
    strongest_failing: float | None = None  # ... and not here
    order_violations: list[str] = field(default_factory=list)

    @property
    def bracketed(self) -> bool:
        """Both ends found, within the factor; for a DP family also in ε, the scale its users set."""
        if self.weakest_holding is None or self.strongest_failing is None:
            return False
        ends = [self._epsilon(self.weakest_holding), self._epsilon(self.strongest_failing)]
        in_epsilon = None not in ends and _ratio(*ends) <= self.factor  # type: ignore[arg-type]
        return _ratio(self.weakest_holding, self.strongest_failing) <= self.factor and (None in ends or in_epsilon)

    def _probe(self, value: float) -> Probe | None:
        return next((p for p in self.probes if p.value == value), None)

    def _epsilon(self, value: float) -> float | None:
        probe = self._probe(value)
        return None if probe is None else probe.epsilon

    def answer(self) -> str:
        hold, fail = self.weakest_holding, self.strongest_failing
        name = f"{self.defense} {self.option}"
        if hold is None:
            return f"{name}: nothing in the searched range holds (strongest tried {fail:g})"
        if fail is None:
            return f"{name}: the weakest value tried holds ({hold:g}); the frontier is below the range"
        within = "" if self.bracketed else f" (not yet within a factor of {self.factor:g})"
        text = (f"{name}: the weakest setting that holds lies between {fail:g} ({self._failed(fail)}"
                f"{self._eps(fail)}) and {hold:g} (holds{self._eps(hold)}){within}")
        if self._undecided(fail):
            # near the frontier a value whose rates were not bounded falls on either side with the draw
            text += (f"; {fail:g} was not shown either way (its rates sit near the tolerance), so a run on other "
                     f"examples may find it holds")
        return text

    def _undecided(self, value: float) -> bool:
        probe = self._probe(value)
        return probe is not None and probe.verdict.startswith("not shown")

    def _failed(self, value: float) -> str:
        """The failing end as measured: a leak grade, or "not shown to hold" (counted as failing)."""
        probe = self._probe(value)
        return "not shown to hold" if probe is None or self._undecided(value) else f"does not hold: {probe.verdict}"

    def _eps(self, value: float) -> str:
        found = self._epsilon(value)
        return "" if found is None else f", ε = {found:.3g} per round at δ = 1e-5"

    def to_dict(self) -> dict[str, Any]:
        return {"defense": self.defense, "option": self.option, "factor": self.factor,
                "weakest_holding": self.weakest_holding, "strongest_failing": self.strongest_failing,
                "bracketed": self.bracketed, "answer": self.answer(), "order_violations": self.order_violations,
                "probes": [{"value": p.value, "verdict": p.verdict, "epsilon": p.epsilon, "text": p.text}
                           for p in self.probes]}


def _ratio(a: float, b: float) -> float:
    return max(a, b) / min(a, b)


def family(text: str) -> tuple[ComponentSpec, str, int]:
    """The defense family (name and base options), the option its strength varies and the
    direction (+1: a larger value is stronger)."""
    from ..defenses import DEFENSES

    spec = parse_spec(text, "defense")
    axis = getattr(DEFENSES.get(spec.name), "strength", None)
    if axis is None:
        raise GradleakError(f"defense '{spec.name}' has no strength order to search (Defense.strength)")
    option, direction = axis
    if option in spec.options:
        raise GradleakError(f"calibrate: '{option}' is what the search varies; give the other options only")
    return spec, option, direction


def probe_sweep(base_text: str, setting: str, source: str, max_examples: int | None = None) -> Sweep:
    """The study's sweep file with every grid's defenses replaced by the one probed setting
    (and no utility runs): the cells of this probe. Its sample ladder may judge each attack on
    up to `max_examples`, by default `PROBE_EXAMPLES_FACTOR` times the study's
    `samples.max_examples`: a probe near the frontier has linkage near the tolerance, and with
    the study's own cap it is often "not shown", which the search counts as not holding. Twice
    the cap decides more of them (DP-SGD on the demo's scenario: σ 0.05623 linkable and 0.06977
    holds with 192 examples, both "not shown" with 96; docs/sweeps-and-report.md), though a
    value at the frontier still falls on either side with the draw."""
    doc = yaml.safe_load(base_text)
    if not isinstance(doc, dict) or not isinstance(doc.get("grids"), list):
        raise GradleakError(f"calibrate: '{source}' is not a sweep file with grids")
    doc.pop("utility", None)
    for grid in doc["grids"]:
        if isinstance(grid, dict):
            grid.pop("defenses", None)
            grid["defenses"] = [setting]
    sweep = parse_sweep(yaml.safe_dump(doc, sort_keys=False), source)
    cap = PROBE_EXAMPLES_FACTOR * sweep.samples.max_examples if max_examples is None else max_examples
    return dataclasses.replace(sweep, samples=dataclasses.replace(sweep.samples, max_examples=cap))


def seeds_note(sweep: Sweep) -> str | None:
    """A line for the answer where the study has fewer than `STUDY_SEEDS` seeds: its bracket may
    not be what another seed set finds."""
    seeds = len({cell.spec.get("seed") for cell in sweep.attack_cells})
    if seeds >= STUDY_SEEDS:
        return None
    return (f"note: the study has {seeds} seed{'s' if seeds != 1 else ''}; the frontier moves with the model's "
            f"initialisation, so another seed set may land one probe step away; give the study {STUDY_SEEDS} "
            f"seeds for a bracket that other seeds reproduce")


def search(evaluate: Callable[[float], Probe], spec: ComponentSpec, option: str, direction: int,
           low: float, high: float, factor: float = 2.0, max_probes: int = 16,
           measure: Callable[[float], float | None] | None = None) -> Calibration:
    """Bisect [low, high] (log space) for the weakest value that holds. `evaluate(value)` runs
    the probe (stored: a value probed before costs nothing). `measure(value)`: the scale the
    bracket is read in besides the value (a DP family's ε; None where there is none): each
    probe then halves the bracket in log measure, so the search stops at the first bracket
    within the factor there rather than bisecting the value past it (`midpoint`)."""
    if not (0 < low < high) or not math.isfinite(high):
        raise GradleakError(f"calibrate: need 0 < low < high, got {low:g} and {high:g}")
    if not factor > 1:
        raise GradleakError(f"calibrate: the factor must be above 1, got {factor:g}")
    result = Calibration(str(spec), option, direction, factor)
    weak, strong = (low, high) if direction > 0 else (high, low)

    def probe(value: float) -> Probe:
        found = evaluate(value)
        result.probes.append(found)
        return found

    # the values as probed (the evaluation may round them, so that stored probes are found again)
    top = probe(strong)
    if not top.holds:
        result.strongest_failing = top.value
    elif (bottom := probe(weak)).holds:
        result.weakest_holding = bottom.value
    else:
        result.weakest_holding, result.strongest_failing = top.value, bottom.value
        while not result.bracketed and len(result.probes) < max_probes:
            found = probe(midpoint(result.strongest_failing, result.weakest_holding, measure))
            if found.holds:
                result.weakest_holding = found.value
            else:
                result.strongest_failing = found.value
    result.order_violations = order_violations_of(result.probes, direction)
    return result


def midpoint(a: float, b: float, measure: Callable[[float], float | None] | None = None) -> float:
    """The value between `a` and `b` whose `measure` is the geometric mean of theirs (found by
    bisection in log value; the measure is monotone over the family's strength), or the
    geometric mean of the values where there is no measure. Halving in log σ halves in log ε
    only where ε is a power of σ, which the accountant's ε is not: on the demo's DP-SGD the σ
    midpoint of 0.05623 and 0.1333 left a bracket 2.02× in ε, and the search took one more
    probe, nearer the frontier, where the ε midpoint (σ 0.08533) leaves 1.97×."""
    plain = math.sqrt(a * b)
    ends = (measure(a), measure(b)) if measure is not None else (None, None)
    if measure is None or not all(m is not None and 0 < m < math.inf for m in ends) or ends[0] == ends[1]:
        return plain
    target = math.sqrt(ends[0] * ends[1])  # type: ignore[operator]
    near_a, near_b = math.log(a), math.log(b)
    for _ in range(60):
        middle = (near_a + near_b) / 2
        found = measure(math.exp(middle))
        if found is None or not 0 < found < math.inf:
            return plain
        if (found - target) * (ends[0] - target) > 0:  # type: ignore[operator]
            near_a = middle  # still on a's side of the target
        else:
            near_b = middle
    return math.exp((near_a + near_b) / 2)


def order_violations_of(probes: list[Probe], direction: int) -> list[str]:
    """Pairs where a weaker value held and a stronger one did not: the search's assumption fails."""
    ordered = sorted(probes, key=lambda p: direction * p.value)  # weakest first
    out = []
    for i, weaker in enumerate(ordered):
        for stronger in ordered[i + 1:]:
            if weaker.holds and not stronger.holds:
                out.append(f"{weaker.value:g} holds but the stronger {stronger.value:g} does not ({stronger.verdict})")
    return out
