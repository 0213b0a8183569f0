"""Liu et al.'s defense criterion over a results store.

Eq. (3): E(D) = min_A d(S, A(D(G))) — a defense is as strong as its error
against the most effective attack. For every scenario (dataset, model, batch
size, local steps) and every defense × strength we pick, per metric, the attack
with the best reconstruction (lowest MSE/LPIPS, highest PSNR/SSIM/ASR), then
attach the utility loss measured by the utility runs and mark the
utility–privacy frontier (no other defense has both less utility loss and a
larger best-attack error).
"""
from __future__ import annotations

import math
from collections import defaultdict
from statistics import mean, stdev

from .store import CellRecord

# metric → True when a larger value means a better reconstruction (stronger attack)
ATTACK_METRICS = {"mse": False, "psnr": True, "ssim": True, "lpips": False, "asr": True}
# utility metrics, in order of preference, and whether larger is better
UTILITY_METRICS = (("test_accuracy", True), ("accuracy", True), ("final_loss", False),
                   ("train_loss", False), ("loss", False))
# A verdict never mixes threat models: what a malicious server gets says nothing about
# an honest one, so the threat model is part of every scenario.
SCENARIO_KEYS = ("threat", "dataset", "model", "batch_size", "local_steps")


def _scenario_label(labels: dict, key: str):
    # rows stored before threat models were recorded carry no 'threat' label
    return labels.get(key, "unrecorded") if key == "threat" else labels.get(key)


def cell_under_budget(cell: CellRecord) -> bool | None:
    """The stored convergence verdict of an attack cell (see experiment.under_budget)."""
    convergence = cell.extras.get("convergence") if isinstance(cell.extras, dict) else None
    return convergence.get("under_budget") if isinstance(convergence, dict) else None


# A defense "holds" in a scenario when no attack reconstructed any example exactly (ASR 0 in
# every seed), the strongest attack was not stopped by its budget, at least HOLDS_MIN_SEEDS
# seeds ran, and the upper end of the 95% interval of the best SSIM stays below HOLDS_SSIM
# (reconstructions that share little structure with the originals).
HOLDS_SSIM = 0.3
HOLDS_MIN_SEEDS = 2

# An undefended utility model whose accuracy is within this of chance (1/classes) did not
# train: every defense then "costs" nothing, which says nothing about the defense. The same
# margin as gradleak.utility.NEAR_CHANCE, by which a sweep refuses such a baseline up front
# (a copy: importing gradleak.utility would load torch); stores written before that refusal,
# or by hand, can still hold one.
NEAR_CHANCE = 0.1


def _avg(values):
    values = [v for v in values if v is not None]
    return float(mean(values)) if values else None


def interval95(values) -> tuple[float | None, float | None]:
    """Mean and half-width of the 95% Student-t interval of the mean (None with fewer
    than two values: one seed gives no interval)."""
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not values:
        return None, None
    centre = float(mean(values))
    if len(values) < 2:
        return centre, None
    from scipy.stats import t

    return centre, float(t.ppf(0.975, len(values) - 1) * stdev(values) / math.sqrt(len(values)))


def attack_rows(cells: list[CellRecord]) -> list[dict]:
    """One row per (scenario, defense, strength, attack): metrics averaged over seeds."""
    groups: dict[tuple, list[CellRecord]] = defaultdict(list)
    for c in cells:
        if c.kind != "attack":
            continue
        lab = c.labels
        groups[(*[_scenario_label(lab, k) for k in SCENARIO_KEYS], lab["defense"], lab["strength"],
                lab["attack_spec"])].append(c)
    rows = []
    for key, members in groups.items():
        lab = members[0].labels
        metric_names = sorted({k for m in members for k in m.metrics})
        budget_flags = [cell_under_budget(m) for m in members]
        row = {**{k: _scenario_label(lab, k) for k in SCENARIO_KEYS}, "defense": lab["defense"],
               "strength": lab["strength"], "attack": lab["attack"], "attack_spec": lab["attack_spec"],
               "init": lab.get("init"), "seeds": len(members), "seconds": _avg([m.seconds for m in members]),
               "under_budget": any(budget_flags) if any(f is not None for f in budget_flags) else None,
               "keys": [m.key for m in members]}
        for name in metric_names:
            row[name], row[f"{name}_ci"] = interval95([m.metrics.get(name) for m in members])
        rows.append(row)
    rows.sort(key=lambda r: (*[str(r[k]) for k in SCENARIO_KEYS], r["defense"] != "none", r["defense"],
                             r["strength"], r["attack_spec"]))
    return rows


def utility_table(cells: list[CellRecord]) -> dict[tuple, dict]:
    """(dataset, model, defense, strength) → averaged utility metrics (over seeds)."""
    groups: dict[tuple, list[CellRecord]] = defaultdict(list)
    for c in cells:
        if c.kind == "utility":
            lab = c.labels
            groups[(lab["dataset"], lab["model"], lab["defense"], lab["strength"])].append(c)
    table = {}
    for key, members in groups.items():
        names = {k for m in members for k, v in m.metrics.items() if isinstance(v, (int, float))}
        table[key] = {"seeds": len(members), "trained_model": members[0].labels.get("trained_model"),
                      "dataset_spec": members[0].spec.get("dataset") if isinstance(members[0].spec, dict) else None}
        for n in names:
            table[key][n], table[key][f"{n}_ci"] = interval95([m.metrics.get(n) for m in members])
    return table


def _utility_metric(table: dict) -> tuple[str, bool] | None:
    for name, higher in UTILITY_METRICS:
        if any(row.get(name) is not None for row in table.values()):
            return name, higher
    return None


def strongest_attacks(cells: list[CellRecord]) -> list[dict]:
    """Liu et al. Eq. (3) per scenario × defense × strength, with utility loss and frontier flags."""
    rows = attack_rows(cells)
    utilities = utility_table(cells)
    metric = _utility_metric(utilities)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(*[r[k] for k in SCENARIO_KEYS], r["defense"], r["strength"])].append(r)
    out = []
    for key, members in groups.items():
        first = members[0]
        entry = {**{k: first[k] for k in SCENARIO_KEYS}, "defense": first["defense"], "strength": first["strength"],
                 "attacks": len(members)}
        strongest: set[str] = set()
        for name, higher in ATTACK_METRICS.items():
            scored = [m for m in members if m.get(name) is not None]
            if not scored:
                entry[name] = entry[f"best_{name}"] = None
                continue
            best = (max if higher else min)(scored, key=lambda m: m[name])
            tied = [m for m in scored if m[name] == best[name]]
            entry[name], entry[f"{name}_ci"] = best[name], best.get(f"{name}_ci")
            entry[f"best_{name}"] = ("(all tie)" if len(tied) == len(scored) > 1
                                     else ", ".join(m["attack_spec"] for m in tied))
            strongest.update(m["attack_spec"] for m in tied if m.get("under_budget"))
        # The verdict is only as good as its strongest attack: one stopped by its budget may
        # understate the leakage, so a defense that "holds" against it is not shown to hold.
        entry["under_budget"] = ", ".join(sorted(strongest)) or None
        entry["seeds"] = min(m["seeds"] for m in members)
        entry["verdict"] = verdict(entry)
        entry.update(_utility_loss(entry, utilities, metric))
        out.append(entry)
    _mark_frontier(out)
    return out


def verdict(entry: dict) -> str:
    """'leaks', 'holds' or 'not shown (why)' for one strongest-attack entry."""
    if entry.get("asr"):
        return "leaks"
    if entry.get("under_budget"):
        return "not shown (attack under budget)"
    if entry.get("ssim") is None:
        return "not shown (no SSIM)"
    if entry.get("seeds", 1) < HOLDS_MIN_SEEDS or entry.get("ssim_ci") is None:
        return "not shown (one seed: no interval)"
    if entry["ssim"] + entry["ssim_ci"] < HOLDS_SSIM:
        return "holds"
    return f"not shown (SSIM up to {min(1.0, entry['ssim'] + entry['ssim_ci']):.2f})"


_CLASSES: dict[str, int | None] = {}


def _num_classes(row: dict) -> int | None:
    """The class count a utility row was trained on: stored with the run, or (stores written
    before it was) read from the dataset itself; None when neither is available."""
    stored = row.get("num_classes")
    if isinstance(stored, (int, float)) and stored >= 2:
        return int(round(stored))
    text = row.get("dataset_spec")
    if not isinstance(text, str):
        return None
    if text not in _CLASSES:
        try:
            from .data import load_dataset
            from .experiment import dataset_spec

            _CLASSES[text] = load_dataset(dataset_spec(text, "test", None)).num_classes
        except Exception:  # a dataset no longer at hand: the rule is not applied
            _CLASSES[text] = None
    return _CLASSES[text]


def did_not_train(baseline: dict, metric: str) -> str | None:
    """'utility model did not train (accuracy X ≈ chance Y)' when the undefended run's accuracy
    is at most chance + NEAR_CHANCE, else None."""
    accuracy = baseline.get(metric)
    # accuracy above 0.5 + NEAR_CHANCE is above chance + NEAR_CHANCE for any class count: no lookup
    if "accuracy" not in metric or accuracy is None or accuracy > 0.5 + NEAR_CHANCE:
        return None
    classes = _num_classes(baseline)
    if classes is None or accuracy > 1.0 / classes + NEAR_CHANCE:
        return None
    return f"utility model did not train (accuracy {accuracy:.3g} ≈ chance {1.0 / classes:.3g})"


def _utility_loss(entry: dict, utilities: dict, metric: tuple[str, bool] | None) -> dict:
    empty = {"utility_metric": None, "utility": None, "utility_loss": None, "utility_loss_ci": None,
             "utility_model": None, "utility_note": None}
    if metric is None:
        return empty
    name, higher = metric
    base = (entry["dataset"], entry["model"])
    mine = utilities.get((*base, entry["defense"], entry["strength"]))
    baseline = utilities.get((*base, "none", ""))
    if mine is None or baseline is None or mine.get(name) is None or baseline.get(name) is None:
        return {**empty, "utility_metric": name}
    trained = mine.get("trained_model")
    model = trained if trained and trained != entry["model"] else None
    note = did_not_train(baseline, name)
    if note:
        # no loss at all: a loss of 0 would read as a free defense
        return {**empty, "utility_metric": name, "utility": mine[name], "utility_model": model, "utility_note": note}
    loss = (baseline[name] - mine[name]) if higher else (mine[name] - baseline[name])
    spreads = [mine.get(f"{name}_ci"), baseline.get(f"{name}_ci")]
    # independent runs: the half-widths add in quadrature
    loss_ci = math.sqrt(sum(h * h for h in spreads)) if all(h is not None for h in spreads) else None
    return {"utility_metric": name, "utility": mine[name], "utility_loss": loss, "utility_loss_ci": loss_ci,
            "utility_model": model, "utility_note": None}


def _mark_frontier(entries: list[dict]) -> None:
    """Within each scenario: a defense setting is on the frontier when no other has
    lower-or-equal utility loss and a strictly larger best-attack MSE (or equal
    MSE and strictly lower utility loss)."""
    by_scenario: dict[tuple, list[dict]] = defaultdict(list)
    for e in entries:
        e["frontier"] = None
        if e.get("utility_loss") is not None and e.get("mse") is not None:
            by_scenario[tuple(e[k] for k in SCENARIO_KEYS)].append(e)
    for members in by_scenario.values():
        for e in members:
            e["frontier"] = not any(
                (o["utility_loss"] <= e["utility_loss"] and o["mse"] > e["mse"])
                or (o["utility_loss"] < e["utility_loss"] and o["mse"] >= e["mse"])
                for o in members if o is not e)


def study_tables(cells: list[CellRecord]) -> dict[str, list[dict]]:
    """Wei et al.-style studies: ASR and iterations per attack as one factor varies
    (the others averaged): initialisation, batch size, local iterations, compression."""
    rows = attack_rows(cells)
    factors = {
        "initialisation": lambda r: r.get("init") or "default",
        "batch size": lambda r: r["batch_size"],
        "local iterations": lambda r: r["local_steps"],
        "compression": _compression,
    }
    tables = {}
    for title, factor in factors.items():
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for r in rows:
            value = factor(r)
            if value is not None:
                # rows of different threat models, datasets or models are never averaged together
                groups[(r["threat"], r["dataset"], r["model"], r["attack"], value)].append(r)
        values = {k[-1] for k in groups}
        if len(values) < 2:  # nothing varied along this factor in this store
            continue
        table = [{"threat": threat, "dataset": dataset, "model": model, "attack": attack, title: value,
                  "asr": _avg([m.get("asr") for m in members]),
                  "iterations": _avg([m.get("iterations") for m in members]),
                  "psnr": _avg([m.get("psnr") for m in members]), "cells": len(members)}
                 for (threat, dataset, model, attack, value), members in groups.items()]
        table.sort(key=lambda t: (str(t["threat"]), str(t["dataset"]), str(t["model"]), t["attack"],
                                  _sortable(t[title])))
        tables[title] = table
    return tables


_COMPRESSION_DEFENSES = {"prune", "topk", "dgc", "dropout"}


def _compression(row: dict) -> str | None:
    """Compression level for sparsifying defenses ('none' for the undefended run)."""
    if row["defense"] == "none":
        return "none"
    if row["defense"] in _COMPRESSION_DEFENSES:
        return f"{row['defense']} {row['strength']}"
    return None


def _sortable(value):
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def leakage_by_round(cells: list[CellRecord]) -> list[dict]:
    """Rows of a federation's audit (cells labelled with a round): one per round ×
    client × attack, sorted by round, client and attack."""
    rows = []
    for c in cells:
        if c.kind != "attack" or "round" not in c.labels:
            continue
        lab = c.labels
        rows.append({"round": lab["round"], "client": lab.get("client"), "attack": lab.get("attack_spec"),
                     "defense": lab.get("defense"), **{k: c.metrics.get(k) for k in ATTACK_METRICS},
                     "key": c.key})
    rows.sort(key=lambda r: (_sortable(r["round"]), _sortable(r["client"]), str(r["attack"])))
    return rows


MATRIX_KEYS = ("threat", "dataset", "model")  # one matrix each
MATRIX_ROW_KEYS = ("batch_size", "local_steps", "defense", "strength")


def _cell_threat(cell: CellRecord):
    # skipped rows name the threat model only in their spec
    threat = cell.labels.get("threat")
    if threat is None and isinstance(cell.spec, dict):
        threat = cell.spec.get("threat")
    return threat if threat is not None else "unrecorded"


def _better(a: CellRecord, b: CellRecord) -> bool:
    """Is a's reconstruction better than b's: lower MSE, then higher PSNR."""
    def rank(c):
        mse, psnr = c.metrics.get("mse"), c.metrics.get("psnr")
        return (mse if isinstance(mse, (int, float)) else math.inf, -(psnr if isinstance(psnr, (int, float)) else
                                                                     -math.inf))
    return rank(a) < rank(b)


def best_reconstructions(cells: list[CellRecord]) -> list[dict]:
    """The defense × attack matrices of the report: one per (threat model, dataset, model);
    rows are defense settings (with batch size and local steps, never mixed), columns attacks.
    A cell holds the best-reconstructing attack cell over seeds (lowest MSE), or why there is
    none: the attack was not run (with the reason) or failed (with the error)."""
    groups: dict[tuple, dict] = {}
    for c in cells:
        kind = c.kind if c.kind != "failed" else ("failed" if c.labels.get("cell_kind") == "attack" else None)
        if kind not in ("attack", "skipped", "failed") or not c.labels.get("attack_spec"):
            continue
        lab = c.labels
        key = (_cell_threat(c), lab.get("dataset"), lab.get("model"))
        group = groups.setdefault(key, {"rows": {}, "columns": {}, "cells": {}})
        row = tuple(lab.get(k) if k != "strength" else lab.get(k) or "" for k in MATRIX_ROW_KEYS)
        if row[2] is None:
            row = (row[0], row[1], "none", "")
        column = str(lab["attack_spec"])
        group["rows"][row] = None
        group["columns"][column] = None
        slot = group["cells"].setdefault((row, column), {"best": None, "seeds": 0, "failed": [], "not_run": None})
        if kind == "attack":
            slot["seeds"] += 1
            if slot["best"] is None or _better(c, slot["best"]):
                slot["best"] = c
        elif kind == "failed":
            error = c.extras.get("error") if isinstance(c.extras, dict) else None
            slot["failed"].append(str(error or "no error recorded"))
        else:
            slot["not_run"] = str(lab.get("reason") or (c.extras or {}).get("reason") or "not applicable")
    out = []
    order = ["honest", "informed", "malicious"]
    for key, group in sorted(groups.items(), key=lambda kv: (
            order.index(str(kv[0][0]).split("+")[0]) if str(kv[0][0]).split("+")[0] in order else len(order),
            *[str(v) for v in kv[0]])):
        rows = sorted(group["rows"], key=lambda r: (_sortable(r[0]), _sortable(r[1]), r[2] != "none", str(r[2]),
                                                    str(r[3])))
        out.append({**dict(zip(MATRIX_KEYS, key)), "rows": rows, "columns": sorted(group["columns"]),
                    "cells": group["cells"]})
    return out
