"""Attack cells pooled per (scenario, defense, strength, attack): metrics averaged over seeds,
and the leakage evidence (gradleak.leakage.Evidence) of every example attacked, over all
batches and seeds."""
from __future__ import annotations

from collections import defaultdict

from ..leakage import Evidence
from ..store import CellRecord
from .cells import (
    SCENARIO_KEYS,
    average,
    cell_ladder,
    cell_saturated,
    cell_training_blind,
    cell_training_unconfirmed,
    interval95,
    scenario_label,
)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cell_evidence(cell: CellRecord) -> Evidence:
    """The leakage evidence of one attack cell, from its summary metrics (`examples`, `asr`,
    `recognizable`, `linkage`, `linkage_sd`, `linkage_null_var`, `reid_chance`). Cells stored before linkage was
    measured carry only their copies."""
    m = cell.metrics
    examples = _number(m.get("examples"))
    n = int(examples) if examples and examples > 0 else 0
    copies = int(round((_number(m.get("asr")) or 0.0) * n))
    linkage = _number(m.get("linkage"))
    recognizable = _number(m.get("recognizable"))
    if linkage is None or recognizable is None:
        return Evidence(copies=copies, copies_of=n, chance=_number(m.get("reid_chance")) or 0.0)
    return Evidence.of(n, copies, n, int(round(recognizable * n)), linkage, _number(m.get("linkage_sd")),
                       _number(m.get("reid_chance")) or 0.0, int(round((_number(m.get("reid")) or 0.0) * n)),
                       _number(m.get("linkage_null_var")))


def attack_rows(cells: list[CellRecord]) -> list[dict]:
    """One row per (scenario, defense, strength, attack): metrics averaged over seeds, the
    leakage evidence pooled over every example attacked, and how its ladders ended."""
    groups: dict[tuple, list[CellRecord]] = defaultdict(list)
    for c in cells:
        if c.kind != "attack":
            continue
        lab = c.labels
        groups[(*[scenario_label(lab, k) for k in SCENARIO_KEYS], lab["defense"], lab["strength"],
                lab["attack_spec"])].append(c)
    rows = []
    for members in groups.values():
        lab = members[0].labels
        metric_names = sorted({k for m in members for k, v in m.metrics.items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool)})
        # the budget ladder decides saturation on the grid's cells; the sample ladder's cells run
        # at the budget it ended at (gradleak.sweep.samples), adding examples, not budget
        grid = [m for m in members if not m.labels.get("sample_rung")] or members
        ladders = [cell_ladder(m) for m in grid]
        budgets = [int(ld["iterations"]) for ld in ladders if isinstance(ld.get("iterations"), (int, float))
                   and ld.get("iterations")]
        row = {**{k: scenario_label(lab, k) for k in SCENARIO_KEYS}, "defense": lab["defense"],
               "strength": lab["strength"], "attack": lab["attack"], "attack_spec": lab["attack_spec"],
               "init": lab.get("init"),
               # repeats: distinct seeds, and in a Flower audit distinct clients (independent data and draws)
               "seeds": len({(m.labels.get("seed", m.key), m.labels.get("client")) for m in members}),
               "cells": len(members), "seconds": average([m.seconds for m in members]),
               "saturated": all(cell_saturated(m) for m in grid),
               # no iterations to climb (the ladder's decision may still be "leak")
               "analytic": bool(ladders) and all(ld.get("iterations") == 0 for ld in ladders),
               "undecided": sum(ld.get("decision", "undecided") == "undecided" for ld in ladders),
               "budget_min": min(budgets) if budgets else None, "budget_max": max(budgets) if budgets else None,
               "gallery_note": next((ld.get("gallery") for ld in ladders if ld.get("gallery")), None),
               "training_unconfirmed": sum(cell_training_unconfirmed(m) for m in members),
               "training_blind": next((b for b in map(cell_training_blind, members) if b), None),
               "sample_rungs": max((int(m.labels.get("sample_rung") or 0) for m in members), default=0),
               "keys": [m.key for m in members]}
        for name in metric_names:
            row[name], row[f"{name}_ci"] = interval95([m.metrics.get(name) for m in members])
        evidence = sum((cell_evidence(m) for m in members), Evidence())
        row["evidence"] = evidence
        row["examples"] = evidence.copies_of or None
        row["copies"] = evidence.copies if evidence.copies_of else None
        # examples re-identified (nearest among the gallery), shown beside the grades
        found = [(m.metrics.get("reid"), m.metrics.get("examples")) for m in members]
        judged = [(r, n) for r, n in found if _number(r) is not None and _number(n)]
        row["identified"] = sum(int(round(r * n)) for r, n in judged) if judged else None
        row["identified_of"] = sum(int(n) for _, n in judged) if judged else None
        row["reid_chance"] = evidence.chance or None
        # what "copied" means for this data: an exact sequence for text, ASR's MSE bound otherwise
        row["copy_criterion"] = "token for token" if "exact_sequence_accuracy" in metric_names else "MSE ≤ 1e-3"
        rows.append(row)
    rows.sort(key=lambda r: (*[str(r[k]) for k in SCENARIO_KEYS], r["defense"] != "none", r["defense"],
                             r["strength"], r["attack_spec"]))
    return rows


def with_weaker_threats(rows: list[dict]) -> list[dict]:
    """Rows plus, for each threat model, the rows of every weaker one in the same scenario: a
    server that may do more may also run what a weaker server runs (a malicious server can
    invert gradients as an honest one does), so a defense holds against it only if it holds
    against those attacks too. Borrowed rows carry `from_threat`."""
    from ..knowledge import granted

    threats = {str(r["threat"]): granted(str(r["threat"])) for r in rows}
    out = list(rows)
    for r in rows:
        mine = threats[str(r["threat"])]
        if mine is None:
            continue
        for other, grants in threats.items():
            if other != str(r["threat"]) and grants is not None and mine < grants:
                out.append({**r, "threat": other, "from_threat": r["threat"]})
    return out


def failures(cells: list[CellRecord]) -> dict[tuple, int]:
    """Failed attack cells per (scenario, defense, strength)."""
    counts: dict[tuple, int] = defaultdict(int)
    for c in cells:
        if c.kind == "failed" and c.labels.get("cell_kind") == "attack":
            lab = c.labels
            counts[(*[scenario_label(lab, k) for k in SCENARIO_KEYS], lab.get("defense"), lab.get("strength"))] += 1
    return counts
