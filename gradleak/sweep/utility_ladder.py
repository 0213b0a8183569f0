"""The utility sample ladder: more seeds for the defenses whose utility loss is not yet told
precisely enough.

A defense's utility loss is paired (gradleak.analysis.costs): seed by seed, the undefended and
the defended FedAvg runs share their clients, their draws and their data order, so the loss's
interval shrinks with the spread of the differences, not of the accuracies. A rung adds, to
every usable defense whose 95% interval is wider than ± `precision`, the seeds that the spread
measured so far says it needs, up to `max_seeds` — and the
undefended run of each new seed, which its pair needs. Under a utility budget only the losses
that the answer turns on get them: an interval that still holds the budget, or a setting the
answer quotes.
"""
from __future__ import annotations

import dataclasses
import math

from ..analysis.cells import interval95
from ..analysis.costs import baseline_key, near_chance, paired_differences, utility_key, utility_metric, utility_table
from .spec import Cell, UtilityLadder


def seeds_needed(differences: list[float], precision: float, max_seeds: int) -> int:
    """How many seeds a paired loss needs for a 95% half-width of `precision`, if its spread
    stays as measured: the fewest n with t(n−1)·sd/√n ≤ precision, at least one more than ran
    (when not yet precise), at most `max_seeds`."""
    n = len(differences)
    _, half_width = interval95(differences)
    if half_width is None or half_width <= precision:
        return n
    from scipy.stats import t

    spread = half_width * math.sqrt(n) / float(t.ppf(0.975, n - 1))
    wanted = n + 1
    while wanted < max_seeds and float(t.ppf(0.975, wanted - 1)) * spread / math.sqrt(wanted) > precision:
        wanted += 1
    return min(wanted, max_seeds)


def utility_extension(cells: list[Cell], stored, ladder: UtilityLadder, budget: float | None = None,
                      named: set[tuple] | None = None) -> list[Cell]:
    """The utility cells the next rung runs (none when every loss is precise enough, or at its
    seed cap): each planned from a cell of the sweep with only its seed changed. With a utility
    `budget`, only the losses the answer turns on get seeds: those whose interval still holds the
    budget (within it or not is open) and those the answer quotes (`named`: (dataset, model,
    defense, strength) of the settings its text names)."""
    if ladder.precision is None:
        return []
    table = utility_table(stored)
    metric = utility_metric(table)
    if metric is None:
        return []
    name, higher = metric
    templates: dict[tuple, Cell] = {}
    for cell in cells:
        if cell.kind == "utility":
            templates.setdefault(utility_key(cell.labels), cell)
    new_seeds: dict[tuple, list] = {}
    for setting, template in templates.items():
        row, base = table.get(setting), table.get(baseline_key(setting))
        if setting[2] == "none" or row is None or base is None or near_chance(row, name):
            continue  # the baseline against itself, or a defense whose model no longer learns
        differences = paired_differences(row.get(f"{name}_by_seed"), base.get(f"{name}_by_seed"), higher)
        if differences is None:
            continue
        if budget is not None and setting not in (named or set()):
            loss, half_width = interval95(differences)
            if half_width is not None and not loss - half_width <= budget <= loss + half_width:
                continue  # on one side of the budget already, and not quoted: more seeds change nothing
        wanted = seeds_needed(differences, ladder.precision, ladder.max_seeds)
        ran = sorted(row[f"{name}_by_seed"])
        if wanted > len(ran):
            start = max(max(ran) + 1, 0)
            new_seeds[setting] = list(range(start, start + wanted - len(ran)))
            baseline_seeds = new_seeds.setdefault(baseline_key(setting), [])
            baseline_seeds.extend(s for s in new_seeds[setting]
                                  if s not in baseline_seeds and s not in base[f"{name}_by_seed"])
    out = []
    for setting, seeds in new_seeds.items():
        template = templates.get(setting)
        if template is None:
            continue
        for seed in sorted(seeds):
            # the sweep's own cell with only its seed changed (its key follows from the spec)
            out.append(dataclasses.replace(template, spec={**template.spec, "seed": seed},
                                           labels={**template.labels, "seed": seed}, key="", origin="utility ladder"))
    return out
