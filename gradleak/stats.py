"""Intervals for rates counted over examples (re-identified, copied), pooled over seeds.

Whether a reconstruction re-identifies its original is one yes/no trial per example; a
rate is k of n. Its 95% interval is the exact Clopper–Pearson interval (Clopper &
Pearson, Biometrika 1934), which stays valid for the few examples a study attacks
(a Student-t interval over two seeds' rates would span most of [0, 1] and could not tell
3 of 8 re-identified among 1,000 from chance). A rate is *above chance* when the lower end
of its interval exceeds the chance level: a one-sided test at 2.5%.
"""
from __future__ import annotations

LEVEL = 0.95


def binomial_interval(successes: int, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of a rate of `successes` in `trials`."""
    from scipy.stats import beta

    if trials <= 0:
        return 0.0, 1.0
    tail = (1 - level) / 2
    low = 0.0 if successes <= 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes >= trials else float(beta.ppf(1 - tail, successes + 1, trials - successes))
    return low, high


def above_chance(successes: int, trials: int, chance: float, level: float = LEVEL) -> bool:
    """Whether `successes` of `trials` is more than chance could give (the interval's lower end
    is above `chance`)."""
    return successes > 0 and binomial_interval(successes, trials, level)[0] > chance
