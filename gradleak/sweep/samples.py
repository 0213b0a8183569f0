"""The sample ladder: more examples where a verdict is still open.

A setting whose attacks saw too few examples to bound their rates within the tolerance (or
whose leak is borderline) gets fresh examples: each of its attack cells is run again on a new
seed (new examples drawn, new defense noise) with as many batches as the rates, as measured so
far, need to be bounded — at least doubling the examples each rung, never past the sweep's
`max_examples` per attack. Settings already decided (a copy, a clear leak, the tolerance met)
get nothing, so a study spends its examples where the answer is still open. The new cells are
ordinary store rows (label `sample_rung`), so an interrupted ladder resumes like any sweep.
"""
from __future__ import annotations

import dataclasses

from ..analysis.cells import SCENARIO_KEYS
from ..knowledge import granted
from .sample_plan import RungTarget, every_attack_target, examples_per_run, rung_seed, verdict_target
from .spec import Cell, SampleLadder, canonical_json


def _setting(labels: dict) -> tuple:
    return tuple(labels.get(k) for k in SCENARIO_KEYS[1:]) + (labels.get("defense"), labels.get("strength"))


def _covers(entry_threat: str, cell_threat: str) -> bool:
    """Whether a verdict for `entry_threat` rests on attacks run as `cell_threat` (the same
    server, or a weaker one whose attacks it may also run)."""
    if entry_threat == cell_threat:
        return True
    mine, theirs = granted(entry_threat), granted(cell_threat)
    return mine is not None and theirs is not None and theirs < mine


def extension_cells(grid_cells: list[Cell], entries: list[dict], examples_by_attack: dict[tuple, int],
                    rung: int, ladder: SampleLadder, budgets: dict[tuple, int] | None = None) -> list[Cell]:
    """The cells of sample rung `rung` (1, 2, ...): for every open setting, the grid's attack
    cells the verdict's `ladder_attacks` name (all it rests on when it names none) again, on a
    new seed, with enough batches that each attack's examples reach the target.
    `examples_by_attack`: (setting, attack spec) → examples judged so far; `budgets`: (setting,
    attack spec) → the iterations its grid cells' budget ladders ended at, which the new cells
    run at, without climbing again (`saturated_budgets`)."""
    plans: dict[tuple, list[RungTarget]] = {}
    for entry in entries:
        # the last rung extends every attack beside a focused one (every_attack_target)
        extra = every_attack_target(entry, ladder.max_examples) if rung == ladder.rungs and \
            entry.get("ladder_attacks") else None
        for plan in (verdict_target(entry, ladder.max_examples), extra):
            if plan is not None:
                plans.setdefault(_setting(entry), []).append(plan)
    if not plans:
        return []
    by_attack: dict[tuple, list[Cell]] = {}
    targets: dict[tuple, int] = {}
    for cell in grid_cells:
        if cell.kind != "attack":
            continue
        setting, attack, threat = _setting(cell.labels), cell.labels["attack_spec"], cell.labels.get("threat")
        wanted = [plan.target for plan in plans.get(setting, ())
                  if (plan.attacks is None or attack in plan.attacks) and _covers(str(plan.threat), str(threat))]
        if wanted:
            by_attack.setdefault((setting, attack, threat), []).append(cell)
            targets[(setting, attack)] = max(targets.get((setting, attack), 0), *wanted)
    out = []
    for (setting, attack, _), cells in by_attack.items():
        missing = targets[(setting, attack)] - examples_by_attack.get((setting, attack), 0)
        if missing <= 0:
            continue
        batch = int(cells[0].spec["batch_size"])
        per_cell = examples_per_run(missing, len(cells), batch)
        budget = (budgets or {}).get((setting, attack))
        for cell in cells:
            seed = rung_seed(int(cell.spec["seed"]), rung)
            spec = canonical_json({**cell.spec, "seed": seed, "images": per_cell,
                               **(_at_budget(cell.spec, budget) if budget else {})})
            labels = {**cell.labels, "seed": seed, "sample_rung": rung}
            out.append(dataclasses.replace(cell, spec=spec, labels=labels, key=""))
    return out


def examples_judged(cells) -> dict[tuple, int]:
    """(setting, attack spec) → examples its stored attack cells were judged on."""
    counts: dict[tuple, int] = {}
    for c in cells:
        if c.kind != "attack":
            continue
        n = c.metrics.get("examples")
        if isinstance(n, (int, float)):
            key = (_setting(c.labels), c.labels.get("attack_spec"))
            counts[key] = counts.get(key, 0) + int(n)
    return counts


def _at_budget(cell_spec: dict, iterations: int) -> dict:
    """The spec fields that run a grid cell's attack at `iterations` without climbing (an attack
    whose budget is not its `iterations` option climbs as its grid cells did). The attack is the
    one its run spec parsed (`AttackRunSpec.attack_spec`), not its text parsed again."""
    from ..attacks import make_attack
    from ..options import ComponentSpec
    from .cells import attack_run_spec

    spec = attack_run_spec(cell_spec).attack_spec
    if make_attack(spec).budget() is None:
        return {}
    return {"attack": str(ComponentSpec(spec.name, {**spec.options, "iterations": str(iterations)})), "doublings": 0}


def saturated_budgets(cells) -> dict[tuple, int]:
    """(setting, attack spec) → the largest budget its grid cells' ladders ended at, where every
    one of them ended saturated (or analytic): the budget the sample ladder's cells run at. The
    budget ladder decides saturation on the first examples; the sample ladder measures the rates
    at that budget on more (docs/verdicts.md)."""
    ends: dict[tuple, list] = {}
    for c in cells:
        if c.kind != "attack" or c.labels.get("sample_rung"):
            continue
        ladder = c.extras.get("ladder") if isinstance(c.extras, dict) else None
        if not isinstance(ladder, dict):
            continue
        ends.setdefault((_setting(c.labels), c.labels.get("attack_spec")), []).append(ladder)
    return {key: max(int(ld.get("iterations") or 0) for ld in ladders) for key, ladders in ends.items()
            if all(ld.get("saturated") for ld in ladders) and max(int(ld.get("iterations") or 0) for ld in ladders)}
