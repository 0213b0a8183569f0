"""How much an attack's reconstructions leak, with the evidence behind it, and the user's
tolerance a defense must meet to hold.

Three measures per attack, each pooled over the examples it attacked (all batches and
seeds of a setting), each with a 95% interval and a test against what a reconstruction
that carries nothing would give:

- **copies**: examples reconstructed exactly (the modality's copy criterion). A copy is no
  chance event, so one copy decides.
- **recognizable**: examples whose reconstruction re-identifies its original among the
  gallery *and* passes the modality's perceptual bar (gradleak.metrics: a person would
  recognise it; speckle that happens to rank its original first does not pass). The rate
  gets the exact Clopper–Pearson interval; the test is the binomial tail against the
  re-identification chance level (the bar only lowers the true chance level, so the test is
  conservative).
- **linkage**: the linkage AUC, the probability that a reconstruction is nearer its own
  original than a random gallery example (0.5 for nothing, 1 for a copy). Every example
  contributes its own AUC (one minus its normalised gallery rank), so a reconstruction that
  ranks its original 12th of 1,000 counts as evidence, not as a miss. The interval is the
  Student-t interval of the mean over examples; the test against 0.5 uses each example's
  variance under its own permutation null (gradleak.metrics.linkage.null_linkage_variance:
  the original is exchangeable with the gallery when the reconstruction carries nothing), at
  most 1/12 — a rank uniform over the gallery — and less where the linkage distances disagree,
  so averaging them adds power without a chance mean other than 0.5. Examples judged before
  it was kept count 1/12.

A setting runs several attacks, each tested twice (recognizable, linkage): `holm` corrects
those p-values together (Holm, Scand. J. Statist. 1979), so a chance hit somewhere among
them does not make a leak; the study-wide rate of false leaks is bounded per setting by the
level's complement (5%).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import GradleakError
from .options import parse_pairs
from .stats import LEVEL, binomial_interval

# A rank uniform on the gallery gives each example an AUC uniform on [0, 1]: variance 1/12.
NULL_LINKAGE_VARIANCE = 1.0 / 12.0
# Fresh examples for a verdict still open (the sample ladder) come from new seeds: the given
# seed moved by this much per rung, never a seed a study lists itself.
SAMPLE_SEED_OFFSET = 1_000_003
# A significant result whose corrected p-value is above this fraction of the test level is
# borderline: the sample ladder confirms it on fresh examples before it is called.
BORDERLINE_FRACTION = 0.1


@dataclass(frozen=True)
class Tolerance:
    """What a user accepts: a defense holds when every saturated attack's linkage AUC is at
    most `linkage` and its recognizable rate at most `recognizable`, both at the upper end
    of their `level` intervals."""

    linkage: float = 0.6
    recognizable: float = 0.10
    level: float = LEVEL

    def __post_init__(self):
        for name, low, high in (("linkage", 0.5, 1.0), ("recognizable", 0.0, 1.0), ("level", 0.5, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise GradleakError(f"tolerance {name} must be a number, got {value!r}")
            if not low < value < high and not (name == "linkage" and value == high):
                raise GradleakError(f"tolerance {name} must be above {low:g} and below {high:g}, got {value:g}")

    def describe(self) -> str:
        return (f"linkage AUC ≤ {self.linkage:g} and recognizable ≤ {100 * self.recognizable:g}% "
                f"at {100 * self.level:g}%")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_text(self) -> str:
        """The form `parse_tolerance` reads and the store's labels keep."""
        return f"linkage={self.linkage:g},recognizable={self.recognizable:g},level={self.level:g}"


def parse_tolerance(value) -> Tolerance:
    """A Tolerance from `None` (the default), a Tolerance, a mapping, or the command line's
    text `linkage=0.6,recognizable=0.1[,level=0.95]`."""
    if value is None:
        return Tolerance()
    if isinstance(value, Tolerance):
        return value
    if isinstance(value, str):
        text = value
        pairs = parse_pairs([part for part in text.split(",") if part.strip()],
                            lambda _: f"tolerance '{text}': expected key=value pairs, "
                                      "e.g. linkage=0.6,recognizable=0.1")
        fields = {}
        for key, number in pairs.items():
            try:
                fields[key] = float(number)
            except ValueError:
                raise GradleakError(f"tolerance {key} must be a number, got '{number}'") from None
        value = fields
    if not isinstance(value, dict):
        raise GradleakError(f"tolerance must be a mapping of linkage, recognizable and level, got {value!r}")
    unknown = sorted(set(value) - {"linkage", "recognizable", "level"})
    if unknown:
        raise GradleakError(f"tolerance key '{unknown[0]}' unknown; valid: level, linkage, recognizable")
    return Tolerance(**value)


def t_quantile(level: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(1 - (1 - level) / 2, df))


@dataclass(frozen=True)
class Evidence:
    """One attack's reconstructions of one setting, pooled: counts, linkage moments and the
    chance level of re-identification."""

    examples: int = 0  # judged against the gallery (linkage and recognizable known)
    copies: int = 0
    copies_of: int = 0
    recognizable: int = 0
    linkage_sum: float = 0.0
    linkage_sq: float = 0.0
    chance: float = 0.0
    # top-1 re-identifications (rank 0 under some distance, with or without the perceptual
    # bar): reported beside the grades, never graded on (one chance rank 0 must not decide)
    identified: int = 0
    # the sum over examples of their linkage's null variance (None: 1/12 each, the most it can be)
    linkage_null: float | None = None

    @staticmethod
    def of(examples: int, copies: int, copies_of: int, recognizable: int, linkage_mean: float | None,
           linkage_sd: float | None, chance: float, identified: int = 0,
           linkage_null_var: float | None = None) -> Evidence:
        """From a cell's summary (means and the sample standard deviation over its examples;
        `linkage_null_var` the mean null variance, absent from cells stored before it was kept)."""
        n = examples if linkage_mean is not None else 0
        mean, sd = (linkage_mean or 0.0), (linkage_sd or 0.0)
        squares = (n - 1) * sd * sd + n * mean * mean if n else 0.0
        null = n * linkage_null_var if n and linkage_null_var is not None else None
        return Evidence(n, copies, copies_of, recognizable if n else 0, n * mean, squares, chance,
                        identified if n else 0, null)

    def null_variance_sum(self) -> float:
        return self.linkage_null if self.linkage_null is not None else self.examples * NULL_LINKAGE_VARIANCE

    def __add__(self, other: Evidence) -> Evidence:
        null = None if self.linkage_null is None and other.linkage_null is None else \
            self.null_variance_sum() + other.null_variance_sum()
        return Evidence(self.examples + other.examples, self.copies + other.copies, self.copies_of + other.copies_of,
                        self.recognizable + other.recognizable, self.linkage_sum + other.linkage_sum,
                        self.linkage_sq + other.linkage_sq, max(self.chance, other.chance),
                        self.identified + other.identified, null)

    @property
    def linkage(self) -> float | None:
        return self.linkage_sum / self.examples if self.examples else None

    def linkage_interval(self, level: float = LEVEL) -> tuple[float, float]:
        n = self.examples
        if n < 2:
            return 0.0, 1.0
        mean = self.linkage_sum / n
        half = t_quantile(level, n - 1) * self.linkage_sd() / math.sqrt(n)
        return max(0.0, mean - half), min(1.0, mean + half)

    def linkage_p(self) -> float:
        """One-sided p-value of 'nearer its original than chance' (mean AUC above 0.5)."""
        if not self.examples:
            return 1.0
        from scipy.stats import norm

        # the null variance floored a little above zero: a gallery whose every member ties
        # (constant data) gives a statistic that cannot move, and no evidence
        spread = math.sqrt(max(self.null_variance_sum(), 1e-12 * self.examples))
        z = (self.linkage_sum - 0.5 * self.examples) / spread
        return float(norm.sf(z))

    @property
    def recognizable_rate(self) -> float | None:
        return self.recognizable / self.examples if self.examples else None

    def recognizable_interval(self, level: float = LEVEL) -> tuple[float, float]:
        return binomial_interval(self.recognizable, self.examples, level)

    def recognizable_p(self) -> float:
        """One-sided p-value of 'more recognised than chance re-identification gives'."""
        if not self.recognizable:
            return 1.0
        from scipy.stats import binom

        return float(binom.sf(self.recognizable - 1, self.examples, min(1.0, self.chance)))

    def meets(self, tolerance: Tolerance) -> bool:
        """Whether these examples bound both rates within the tolerance."""
        return (not self.copies and self.examples > 0
                and self.linkage_interval(tolerance.level)[1] <= tolerance.linkage
                and self.recognizable_interval(tolerance.level)[1] <= tolerance.recognizable)

    def exceeds(self, tolerance: Tolerance) -> bool:
        """Whether these examples show a rate beyond the tolerance (its interval's lower end above it)."""
        return bool(self.copies) or self.linkage_exceeds(tolerance) or (
            self.examples > 0 and self.recognizable_interval(tolerance.level)[0] > tolerance.recognizable)

    def linkage_exceeds(self, tolerance: Tolerance) -> bool:
        """Whether these examples show the linkage AUC beyond the tolerance (its interval's lower
        end above it)."""
        return self.examples > 0 and self.linkage_interval(tolerance.level)[0] > tolerance.linkage

    def linkage_sd(self) -> float:
        n = self.examples
        if n < 2:
            return 0.0
        mean = self.linkage_sum / n
        return math.sqrt(max(0.0, (self.linkage_sq - n * mean * mean) / (n - 1)))

    def examples_needed(self, tolerance: Tolerance) -> int:
        """About how many examples in all would bound both rates within the tolerance if the
        rates stayed as measured (at least one more than now); 0 when they cannot (a measured
        rate at or above its bound)."""
        n = max(self.examples, 1)
        link = self.linkage if self.linkage is not None else 0.5
        rate = self.recognizable / n
        if link >= tolerance.linkage or rate >= tolerance.recognizable:
            return 0
        need = max(math.ceil((t_quantile(tolerance.level, 30) * self._planning_sd() / (tolerance.linkage - link)) ** 2),
                   n + 1)
        bound = tolerance.recognizable
        while need < 10 ** 6 and binomial_interval(round(rate * need), need, tolerance.level)[1] > bound:
            need = math.ceil(need * 1.25)
        return need

    def examples_to_exceed(self, tolerance: Tolerance) -> int:
        """About how many examples in all would show the linkage AUC beyond the tolerance (its
        interval's lower end above it) if it stayed as measured (at least one more than now); 0
        when it is measured within the tolerance."""
        link = self.linkage
        if link is None or link <= tolerance.linkage:
            return 0
        need = (t_quantile(tolerance.level, 30) * self._planning_sd() / (link - tolerance.linkage)) ** 2
        return max(math.ceil(min(need, 10.0 ** 6)), self.examples + 1)

    def _planning_sd(self) -> float:
        """The linkage's spread for planning how many examples a bound takes: the observed one,
        floored at the null's (a few examples understate it)."""
        return max(math.sqrt(NULL_LINKAGE_VARIANCE), self.linkage_sd())

    def summary(self, level: float = LEVEL) -> dict:
        link_low, link_high = self.linkage_interval(level)
        rec_low, rec_high = self.recognizable_interval(level)
        top_low, top_high = binomial_interval(self.identified, self.examples, level)
        return {"identified": self.identified,
                "identified_rate": self.identified / self.examples if self.examples else None,
                "identified_low": top_low, "identified_high": top_high,
                "examples": self.examples, "copies": self.copies, "copies_of": self.copies_of,
                "recognizable": self.recognizable, "recognizable_rate": self.recognizable_rate,
                "recognizable_low": rec_low, "recognizable_high": rec_high, "recognizable_p": self.recognizable_p(),
                "linkage": self.linkage, "linkage_low": link_low, "linkage_high": link_high,
                "linkage_p": self.linkage_p(), "chance": self.chance}


def sample_target(have: int, needed: int, max_examples: int) -> int:
    """How many examples per attack the next sample rung aims at: at least double what was
    judged, as many as the rates measured so far need (`Evidence.examples_needed`), never past
    `max_examples`."""
    return min(max_examples, max(2 * max(have, 1), needed))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    m = len(p_values)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
