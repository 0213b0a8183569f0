"""Liu et al.'s defense criterion over a results store.

Eq. (3): E(D) = min_A d(S, A(D(G))) — a defense is as strong as its error
against the most effective attack. For every scenario (dataset, model, batch
size, local steps) and every defense × strength we pick, per metric, the attack
with the best reconstruction (lowest MSE/LPIPS, highest PSNR/SSIM/ASR), then
attach the utility loss measured by the utility runs and mark the
utility–privacy frontier (no other defense has both less utility loss and a
larger best-attack error).

Each defense setting then gets a verdict a practitioner can act on:

- **leaks**, graded: `copies` when some attack reconstructed an example exactly (MSE ≤
  1e-3, ASR's criterion), `identifies` when attacks re-identified more examples among the
  gallery than chance gives (the lower end of the 95% Clopper–Pearson interval of the
  pooled rate above the chance level; `gradleak.metrics.reidentify`);
- **holds**, only when at least two seeds ran, every attack that ran ended its budget
  ladder saturated (`experiment.climb`: more budget stopped changing the scores) or is
  analytic, no cell failed, nothing was copied and no more examples were re-identified
  than chance gives on average (a pooled rate at most the chance level), and every captured
  update attacked was reproduced by the declared training (`api.check_declared_training`);
- **not shown**, with the reason, otherwise.
"""
from __future__ import annotations

import math
from collections import defaultdict
from statistics import mean, stdev

from .store import CellRecord

# metric → True when a larger value means a better reconstruction (stronger attack)
ATTACK_METRICS = {"mse": False, "psnr": True, "ssim": True, "lpips": False, "asr": True,
                  "rouge1": True, "rouge2": True}  # ROUGE: token sequences
# utility metrics, in order of preference, and whether larger is better
UTILITY_METRICS = (("test_accuracy", True), ("accuracy", True), ("final_loss", False),
                   ("train_loss", False), ("loss", False))
# A verdict never mixes threat models: what a malicious server gets says nothing about
# an honest one, so the threat model is part of every scenario.
SCENARIO_KEYS = ("threat", "dataset", "model", "batch_size", "local_steps")


def _scenario_label(labels: dict, key: str):
    # rows stored before threat models were recorded carry no 'threat' label
    return labels.get(key, "unrecorded") if key == "threat" else labels.get(key)


def cell_ladder(cell: CellRecord) -> dict:
    """The budget ladder an attack cell climbed (see experiment.climb); {} for cells stored
    without one."""
    ladder = cell.extras.get("ladder") if isinstance(cell.extras, dict) else None
    return ladder if isinstance(ladder, dict) else {}


def cell_saturated(cell: CellRecord) -> bool:
    """Whether more budget would not have changed the cell's result, as the auditor judged it."""
    return bool(cell_ladder(cell).get("saturated"))


def cell_training_unconfirmed(cell: CellRecord) -> bool:
    """Whether the cell attacked a captured update that the declared training, replayed on the
    ground truth, did not reproduce (`api.check_declared_training`): its attacks replayed
    another training than the client's."""
    check = cell.extras.get("training_check") if isinstance(cell.extras, dict) else None
    return isinstance(check, dict) and check.get("confirmed") is False


def cell_training_blind(cell: CellRecord) -> str | None:
    """What of the client's training the cell's attack did not model (`Attack.blind_to`)."""
    blind = cell.extras.get("training_blind") if isinstance(cell.extras, dict) else None
    if isinstance(blind, list):
        blind = next((b for b in blind if b), None)
    return blind if isinstance(blind, str) and blind else None


HOLDS_MIN_SEEDS = 2
# Grades of leakage, strongest first.
GRADES = ("copies", "identifies")

# An undefended utility model whose accuracy is within this of chance (1/classes) did not
# train: every defense then "costs" nothing, which says nothing about the defense. The same
# margin as gradleak.utility.NEAR_CHANCE, by which a sweep refuses such a baseline up front
# (a copy: importing gradleak.utility would load torch); stores written before that refusal,
# or by hand, can still hold one.
NEAR_CHANCE = 0.1
# A language model's (next-token) baseline did not train when its test loss is within this many
# nats of a uniform guess's, log(vocabulary): gradleak.utility.NEAR_UNIFORM_NATS, copied likewise.
NEAR_UNIFORM_NATS = 1.0


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


def _count(cell: CellRecord, rate_key: str) -> tuple[int, int] | None:
    """(examples with the property, examples) of one cell from its rate metric."""
    rate, examples = cell.metrics.get(rate_key), cell.metrics.get("examples")
    if not isinstance(rate, (int, float)) or not isinstance(examples, (int, float)) or examples <= 0:
        return None
    return int(round(rate * examples)), int(examples)


def attack_rows(cells: list[CellRecord]) -> list[dict]:
    """One row per (scenario, defense, strength, attack): metrics averaged over seeds, the
    examples copied and re-identified counted over all seeds, and how its ladders ended."""
    from .stats import above_chance, binomial_interval

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
        metric_names = sorted({k for m in members for k, v in m.metrics.items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool)})
        ladders = [cell_ladder(m) for m in members]
        budgets = [int(ld["iterations"]) for ld in ladders if isinstance(ld.get("iterations"), (int, float))
                   and ld.get("iterations")]
        row = {**{k: _scenario_label(lab, k) for k in SCENARIO_KEYS}, "defense": lab["defense"],
               "strength": lab["strength"], "attack": lab["attack"], "attack_spec": lab["attack_spec"],
               "init": lab.get("init"), "seeds": len(members), "seconds": _avg([m.seconds for m in members]),
               "saturated": all(cell_saturated(m) for m in members),
               "undecided": sum(ld.get("decision", "undecided") == "undecided" for ld in ladders),
               "budget_min": min(budgets) if budgets else None, "budget_max": max(budgets) if budgets else None,
               "gallery_note": next((ld.get("gallery") for ld in ladders if ld.get("gallery")), None),
               "training_unconfirmed": sum(cell_training_unconfirmed(m) for m in members),
               "training_blind": next((b for b in map(cell_training_blind, members) if b), None),
               "keys": [m.key for m in members]}
        for name in metric_names:
            row[name], row[f"{name}_ci"] = interval95([m.metrics.get(name) for m in members])
        copies = [c for c in (_count(m, "asr") for m in members) if c]
        found = [c for c in (_count(m, "reid") for m in members) if c]
        row["examples"] = sum(n for _, n in copies) or None
        row["copies"] = sum(k for k, _ in copies) if copies else None
        chance = max((m.metrics.get("reid_chance") or 0.0 for m in members), default=0.0)
        if found and chance:
            k, n = sum(k for k, _ in found), sum(n for _, n in found)
            row["identified"], row["identified_of"], row["reid_chance"] = k, n, chance
            row["reid_low"], row["reid_high"] = binomial_interval(k, n)
            identifies = above_chance(k, n, chance)
        else:
            row["identified"] = row["identified_of"] = row["reid_chance"] = None
            row["reid_low"] = row["reid_high"] = None
            identifies = False
        row["grade"] = "copies" if row["copies"] else ("identifies" if identifies else None)
        # what "copied" means for this data: an exact sequence for text, ASR's MSE bound otherwise
        row["copy_criterion"] = "token for token" if "exact_sequence_accuracy" in metric_names else "MSE ≤ 1e-3"
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
    # language models: next-token accuracy saturates at the frequent tokens, the loss does not
    if table and all(row.get("next_token") for row in table.values()):
        return "test_loss", False
    for name, higher in UTILITY_METRICS:
        if any(row.get(name) is not None for row in table.values()):
            return name, higher
    return None


def strongest_attacks(cells: list[CellRecord]) -> list[dict]:
    """Liu et al. Eq. (3) per scenario × defense × strength, with the verdict (leak grade,
    holds or not shown), utility loss and frontier flags."""
    rows = with_weaker_threats(attack_rows(cells))
    utilities = utility_table(cells)
    metric = _utility_metric(utilities)
    failures = _failures(cells)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(*[r[k] for k in SCENARIO_KEYS], r["defense"], r["strength"])].append(r)
    out = []
    for key, members in groups.items():
        first = members[0]
        entry = {**{k: first[k] for k in SCENARIO_KEYS}, "defense": first["defense"], "strength": first["strength"],
                 "attacks": len(members)}
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
        entry["seeds"] = min(m["seeds"] for m in members)
        entry.update(_grade(members))
        entry["failed"] = failures.get(key, 0)
        entry["training_unconfirmed"] = max(m.get("training_unconfirmed", 0) for m in members)
        blind = [m for m in members if m.get("training_blind")]
        entry["blind_only"] = len(blind) == len(members)
        entry["blind_note"] = (f"{blind[0]['attack_spec']} {blind[0]['training_blind']}" if blind else None)
        entry["verdict"], entry["verdict_text"] = verdict(entry)
        entry.update(_utility_loss(entry, utilities, metric))
        out.append(entry)
    _mark_frontier(out)
    return out


def with_weaker_threats(rows: list[dict]) -> list[dict]:
    """Rows plus, for each threat model, the rows of every weaker one in the same scenario: a
    server that may do more may also run what a weaker server runs (a malicious server can
    invert gradients as an honest one does), so a defense holds against it only if it holds
    against those attacks too. Borrowed rows carry `from_threat`."""
    from .knowledge import granted

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


def _failures(cells: list[CellRecord]) -> dict[tuple, int]:
    """Failed attack cells per (scenario, defense, strength)."""
    counts: dict[tuple, int] = defaultdict(int)
    for c in cells:
        if c.kind == "failed" and c.labels.get("cell_kind") == "attack":
            lab = c.labels
            counts[(*[_scenario_label(lab, k) for k in SCENARIO_KEYS], lab.get("defense"), lab.get("strength"))] += 1
    return counts


def _grade(members: list[dict]) -> dict:
    """The strongest leak grade among a setting's attacks and the attack that reached it:
    the most examples copied, else the most re-identified (by the lower end of the rate's
    interval); with no grade, the attack whose re-identification rate is highest."""
    def strength(m: dict):
        copy_rate = (m.get("copies") or 0) / (m.get("examples") or 1)
        return (-GRADES.index(m["grade"]) if m.get("grade") else -len(GRADES), copy_rate,
                m.get("reid_low") or 0.0, (m.get("identified") or 0) / (m.get("identified_of") or 1))

    best = max(members, key=strength)
    judged = [m for m in members if m.get("identified") is not None]
    return {"grade": best.get("grade"), "grade_attack": _attack_name(best), "examples": best.get("examples"),
            "copies": best.get("copies"), "copy_criterion": best.get("copy_criterion"),
            "identified": best.get("identified"),
            "identified_of": best.get("identified_of"), "reid_chance": best.get("reid_chance"),
            "reid": None if best.get("identified") is None else best["identified"] / best["identified_of"],
            "reid_low": best.get("reid_low"), "reid_high": best.get("reid_high"),
            "reid_judged": len(judged) == len(members),
            "identified_any": max((m.get("identified") or 0) / (m.get("identified_of") or 1) for m in members),
            "gallery_note": next((m.get("gallery_note") for m in members if m.get("gallery_note")), None),
            "unsaturated": ", ".join(sorted(_attack_name(m) for m in members if not m.get("saturated"))) or None,
            "budget_min": min((m["budget_min"] for m in members if m.get("budget_min")), default=None),
            "budget_max": max((m["budget_max"] for m in members if m.get("budget_max")), default=None),
            "attack_specs": sorted(_attack_name(m) for m in members)}


def _attack_name(row: dict) -> str:
    return row["attack_spec"] + (f" (as the {row['from_threat']} server)" if row.get("from_threat") else "")


def _count_text(k: int, n: int) -> str:
    return f"{k} of {n} example{'s' if n != 1 else ''}"


def budget_range(entry: dict) -> str | None:
    """The iterations a setting's ladders ended at, "400" or "40–800"; None when every attack
    was analytic."""
    low, high = entry.get("budget_min"), entry.get("budget_max")
    if not high:
        return None
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _budget_text(entry: dict) -> str:
    spent = budget_range(entry)
    return f"{spent} iterations" if spent else "analytic"


def verdict(entry: dict) -> tuple[str, str]:
    """('leaks' | 'holds' | 'not shown (why)', the verdict in one sentence) for one setting."""
    grade, attack = entry.get("grade"), entry.get("grade_attack")
    if grade == "copies":
        return "leaks", (f"leaks: {_count_text(entry['copies'], entry['examples'])} copied exactly "
                         f"({entry.get('copy_criterion') or 'MSE ≤ 1e-3'}) by {attack}")
    if grade == "identifies":
        return "leaks", (f"leaks: {_count_text(entry['identified'], entry['identified_of'])} re-identified "
                         f"by {attack}; chance {percent(entry['reid_chance'])}")
    against = ", ".join(entry.get("attack_specs") or [])
    if entry.get("failed"):
        return "not shown (attack failed)", f"not shown: {entry['failed']} attack cell(s) failed"
    if entry.get("training_unconfirmed"):
        return ("not shown (training not confirmed)",
                f"not shown: the declared training did not reproduce {entry['training_unconfirmed']} captured "
                "update(s), so the attacks replayed another training than the client's")
    if entry.get("blind_only"):
        return ("not shown (training not modelled)",
                f"not shown: every attack was blind to the client's training ({entry['blind_note']})")
    if entry.get("unsaturated"):
        return ("not shown (attack not saturated)",
                f"not shown: {entry['unsaturated']} still improving at its cap ({_budget_text(entry)}); "
                "more budget could change the verdict")
    if not entry.get("reid_judged"):
        return "not shown (no re-identification)", "not shown: no gallery to re-identify the reconstructions among"
    if entry.get("seeds", 1) < HOLDS_MIN_SEEDS:
        return "not shown (one seed)", f"not shown: one seed (holds needs {HOLDS_MIN_SEEDS})"
    if entry.get("identified_any", 0) > (entry.get("reid_chance") or 0):
        return ("not shown (re-identification above chance, not significant)",
                f"not shown: {_count_text(entry['identified'], entry['identified_of'])} re-identified by "
                f"{attack}, above chance ({percent(entry['reid_chance'])}) but within its interval")
    return "holds", (f"holds against {against} (saturated at {_budget_text(entry)}; "
                     f"{_count_text(entry['identified'] or 0, entry['identified_of'] or 0)} re-identified, "
                     f"chance {percent(entry['reid_chance'])}; with this many examples the rate could still be "
                     f"up to {percent(entry['reid_high'])})")


def percent(rate: float | None) -> str:
    """A rate as the verdicts print it (0.001998 → "0.2%")."""
    if rate is None:
        return "–"
    return f"{100 * rate:.2g}%"


def answer(entries: list[dict]) -> list[dict]:
    """The answer a practitioner came for, per scenario (threat model, dataset, model, batch
    size, local steps): the cheapest defense setting that holds (least utility loss), or
    the least leaky one when none holds."""
    by_scenario: dict[tuple, list[dict]] = defaultdict(list)
    for e in entries:
        by_scenario[tuple(e[k] for k in SCENARIO_KEYS)].append(e)
    out = []
    for key, members in by_scenario.items():
        holds = [e for e in members if e["verdict"] == "holds"]
        scenario = dict(zip(SCENARIO_KEYS, key))
        if holds:
            cheapest = min(holds, key=lambda e: (e.get("utility_loss") is None, e.get("utility_loss") or 0.0))
            out.append({**scenario, "holds": True, "setting": cheapest, "text": (
                f"cheapest defense that holds: {setting_name(cheapest)}{_loss_text(cheapest)} — "
                f"{cheapest['verdict_text']}")})
        else:
            least = min(members, key=_leakiness)
            out.append({**scenario, "holds": False, "setting": least, "text": (
                f"none of the {len(members)} tested settings is shown to hold; the least leaky is "
                f"{setting_name(least)} ({least['verdict_text']}){_loss_text(least)}")})
    return out


def _leakiness(entry: dict):
    """Sort key, least leaky first: no grade, then identifies, then copies; then the rates and PSNR."""
    severity = {None: 0, "identifies": 1, "copies": 2}[entry.get("grade")]
    copy_rate = (entry.get("copies") or 0) / (entry.get("examples") or 1)
    return (severity, copy_rate, entry.get("identified_any") or 0.0,
            entry.get("psnr") if entry.get("psnr") is not None else 0.0)


def setting_name(entry: dict) -> str:
    return entry["defense"] if not entry.get("strength") else f"{entry['defense']} {entry['strength']}"


def _loss_text(entry: dict) -> str:
    loss = entry.get("utility_loss")
    if loss is None and entry.get("utility_metric") is None:
        return ""  # no utility runs in this store
    if loss is None:
        return ", utility cost unknown" + (f" ({entry['utility_note']})" if entry.get("utility_note") else "")
    ci = entry.get("utility_loss_ci")
    return f", utility loss {loss:.3g}" + (f" ± {ci:.2g}" if ci is not None else "")


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
    is at most chance + NEAR_CHANCE; for a language model, '... (test loss X ≈ a uniform
    guess's Y)' when its test loss is above log(vocabulary) − NEAR_UNIFORM_NATS; else None."""
    if baseline.get("next_token"):
        loss, vocabulary = baseline.get("test_loss"), _num_classes(baseline)
        if loss is None or vocabulary is None or loss <= math.log(vocabulary) - NEAR_UNIFORM_NATS:
            return None
        return f"utility model did not train (test loss {loss:.3g} ≈ a uniform guess's {math.log(vocabulary):.3g})"
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
        mse, psnr, rouge = c.metrics.get("mse"), c.metrics.get("psnr"), c.metrics.get("rouge1")
        return (mse if isinstance(mse, (int, float)) else math.inf,
                -(psnr if isinstance(psnr, (int, float)) else -math.inf),
                -(rouge if isinstance(rouge, (int, float)) else -math.inf))
    return rank(a) < rank(b)


def best_reconstructions(cells: list[CellRecord]) -> list[dict]:
    """The defense × attack matrices of the report: one per (threat model, dataset, model);
    rows are defense settings (with batch size and local steps, never mixed), columns attacks.
    A cell holds the best-reconstructing attack cell over seeds (lowest MSE; for token
    sequences, highest ROUGE-1), or why there is
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
