"""What a defense costs in utility: the utility runs averaged per setting, the loss against
the undefended run with its interval, the refusal of a baseline that did not train, and the
utility–privacy frontier."""
from __future__ import annotations

import functools
import math
from collections import defaultdict

from ..rero import reconstruction_bound
from ..store import CellRecord
from .cells import SCENARIO_KEYS, interval95

# utility metrics, in order of preference, and whether larger is better
UTILITY_METRICS = (("test_accuracy", True), ("accuracy", True), ("final_loss", False),
                   ("train_loss", False), ("loss", False))
# An undefended utility model whose accuracy is within this of chance (1/classes) did not
# train: every defense then "costs" nothing, which says nothing about the defense. The same
# margin as gradleak.utility.NEAR_CHANCE, by which a sweep refuses such a baseline up front
# (a copy: importing gradleak.utility would load torch); stores written before that refusal,
# or by hand, can still hold one.
NEAR_CHANCE = 0.1
# A language model's (next-token) baseline did not train when its test loss is within this many
# nats of a uniform guess's, log(vocabulary): gradleak.utility.NEAR_UNIFORM_NATS, copied likewise.
NEAR_UNIFORM_NATS = 1.0


def utility_key(record: dict) -> tuple:
    """The key of a setting's utility runs: (dataset, model, defense, strength) of a utility
    cell's labels or a verdict entry."""
    return (record["dataset"], record["model"], record["defense"], record["strength"])


def baseline_key(key: tuple) -> tuple:
    """The key of the undefended utility runs a setting's loss is measured against."""
    return (*key[:2], "none", "")


def utility_table(cells: list[CellRecord]) -> dict[tuple, dict]:
    """`utility_key` → averaged utility metrics (over seeds)."""
    groups: dict[tuple, list[CellRecord]] = defaultdict(list)
    for c in cells:
        if c.kind == "utility":
            groups[utility_key(c.labels)].append(c)
    table = {}
    for key, members in groups.items():
        names = {k for m in members for k, v in m.metrics.items() if isinstance(v, (int, float))}
        table[key] = {"seeds": len(members), "trained_model": members[0].labels.get("trained_model"),
                      "dataset_spec": members[0].spec.get("dataset") if isinstance(members[0].spec, dict) else None,
                      # a DP defense's Rényi curve: the same spec accounts the same on every seed
                      "rdp": members[0].extras.get("rdp")}
        for n in names:
            table[key][n], table[key][f"{n}_ci"] = interval95([m.metrics.get(n) for m in members])
            # per seed, for the paired utility loss: a seed's defended and undefended runs share
            # their clients, their draws of clients and their data order (gradleak.utility)
            table[key][f"{n}_by_seed"] = {m.labels.get("seed"): m.metrics[n] for m in members
                                          if isinstance(m.metrics.get(n), (int, float))}
    return table


def utility_metric(table: dict) -> tuple[str, bool] | None:
    # language models: next-token accuracy saturates at the frequent tokens, the loss does not
    if table and all(row.get("next_token") for row in table.values()):
        return "test_loss", False
    for name, higher in UTILITY_METRICS:
        if any(row.get(name) is not None for row in table.values()):
            return name, higher
    return None


def _num_classes(row: dict) -> int | None:
    """The class count a utility row was trained on: stored with the run, or (stores written
    before it was) read from the dataset reference itself; None when neither is available."""
    stored = row.get("num_classes")
    if isinstance(stored, (int, float)) and stored >= 2:
        return int(round(stored))
    return _classes_of(row.get("dataset_spec"))


@functools.lru_cache(maxsize=16)
def _classes_of(reference) -> int | None:
    if not isinstance(reference, str):
        return None
    try:
        from ..data.references import load_reference

        return load_reference(reference).num_classes
    except Exception:  # a dataset no longer at hand: the rule is not applied
        return None


def did_not_train(baseline: dict, metric: str) -> str | None:
    """'utility model did not train (accuracy X ≈ chance Y)' when the undefended run learned
    nothing (`near_chance`); else None."""
    reason = near_chance(baseline, metric)
    return None if reason is None else f"utility model did not train ({reason})"


def near_chance(row: dict, metric: str) -> str | None:
    """'accuracy X ≈ chance Y' when a utility run's accuracy is at most chance + NEAR_CHANCE; for
    a language model, 'test loss X ≈ a uniform guess's Y' when its test loss is above
    log(vocabulary) − NEAR_UNIFORM_NATS; else None: the run learned something."""
    if row.get("next_token"):
        loss, vocabulary = row.get("test_loss"), _num_classes(row)
        if loss is None or vocabulary is None or loss <= math.log(vocabulary) - NEAR_UNIFORM_NATS:
            return None
        return f"test loss {loss:.3g} ≈ a uniform guess's {math.log(vocabulary):.3g}"
    accuracy = row.get(metric)
    # accuracy above 0.5 + NEAR_CHANCE is above chance + NEAR_CHANCE for any class count: no lookup
    if "accuracy" not in metric or accuracy is None or accuracy > 0.5 + NEAR_CHANCE:
        return None
    classes = _num_classes(row)
    if classes is None or accuracy > 1.0 / classes + NEAR_CHANCE:
        return None
    return f"accuracy {accuracy:.3g} ≈ chance {1.0 / classes:.3g}"


def utility_loss(entry: dict, utilities: dict, metric: tuple[str, bool] | None) -> dict:
    """The setting's utility loss against the undefended run, with the half-width of its 95%
    interval; `utility_resolved` is False when that interval is as wide as the loss itself (the
    runs cannot tell the cost from nothing)."""
    empty = {"utility_metric": None, "utility": None, "utility_loss": None, "utility_loss_ci": None,
             "utility_model": None, "utility_note": None, "utility_resolved": None}
    if metric is None:
        return empty
    name, higher = metric
    mine = utilities.get(utility_key(entry))
    baseline = utilities.get(baseline_key(utility_key(entry)))
    if mine is None or baseline is None or mine.get(name) is None or baseline.get(name) is None:
        return {**empty, "utility_metric": name}
    trained = mine.get("trained_model")
    model = trained if trained and trained != entry["model"] else None
    note = did_not_train(baseline, name)
    if note:
        # no loss at all: a loss of 0 would read as a free defense
        return {**empty, "utility_metric": name, "utility": mine[name], "utility_model": model, "utility_note": note}
    loss = (baseline[name] - mine[name]) if higher else (mine[name] - baseline[name])
    # a defense that breaks the model is no answer: the same rule as the baseline's
    reason = near_chance(mine, name)
    unusable = None if reason is None else f"the model no longer learns under it ({reason})"
    same_run = entry["defense"] == "none"
    paired = paired_differences(mine.get(f"{name}_by_seed"), baseline.get(f"{name}_by_seed"), higher)
    if same_run:
        loss, loss_ci = 0.0, 0.0  # the baseline against itself, seed by seed
    elif paired is not None:
        # the paired design: the defense's cost seed by seed, from runs that differ only in it
        loss, loss_ci = interval95(paired)
    else:
        spreads = [mine.get(f"{name}_ci"), baseline.get(f"{name}_ci")]
        # no seed in common: independent runs, whose half-widths add in quadrature
        loss_ci = math.sqrt(sum(h * h for h in spreads)) if all(h is not None for h in spreads) else None
    resolved = True if same_run else (loss_ci is not None and loss_ci < abs(loss))
    return {"utility_metric": name, "utility": mine[name], "utility_loss": loss, "utility_loss_ci": loss_ci,
            "utility_model": model, "utility_note": None, "utility_resolved": resolved,
            **({"unusable": unusable} if unusable else {})}



def paired_differences(mine: dict | None, baseline: dict | None, higher: bool) -> list[float] | None:
    """The utility loss seed by seed (baseline − defended for a metric where higher is better),
    over the seeds both ran; None with fewer than two such seeds (no paired interval)."""
    if not mine or not baseline:
        return None
    seeds = sorted(set(mine) & set(baseline), key=str)
    if len(seeds) < 2:
        return None
    return [(baseline[s] - mine[s]) if higher else (mine[s] - baseline[s]) for s in seeds]


def privacy_bound(entry: dict, utilities: dict, members: list[dict]) -> dict:
    """For a DP defense: its ε (at the utility run's δ) and the reconstruction-robustness bound
    its Rényi curve gives (gradleak.rero): the largest probability that any attacker
    re-identifies an example, against the chance of the attacks' gallery (the best of a guess).
    It bounds an attacker who saw every round of the utility run's training, a stronger one than
    the audited update's."""
    row = utilities.get(utility_key(entry)) or {}
    chances = [m["reid_chance"] for m in members if m.get("reid_chance")]
    epsilon, curve = row.get("epsilon"), row.get("rdp")
    if epsilon is None:
        return {}  # no DP defense: no columns (a study without one exports what it did before)
    if not curve or not chances:
        return {"epsilon": epsilon, "rero_bound": None, "rero_chance": None, "rero_text": None}
    chance = max(chances)
    bound = reconstruction_bound([tuple(p) for p in curve], chance)
    return {"epsilon": epsilon, "rero_bound": bound, "rero_chance": chance,
            "rero_text": f"re-identified ≤ {bound:.3g} by any attacker (chance {chance:.3g})"}


def mark_frontier(entries: list[dict]) -> None:
    """Within each scenario: a defense setting is on the frontier when no other has
    lower-or-equal utility loss and strictly less leakage (or equal leakage and strictly lower
    utility loss). Leakage is the verdict's own measure, the deciding attack's linkage AUC
    (`ev_linkage`, lower is better); a scenario with a setting that has none (a store written
    before linkage was measured) falls back to the best attack's MSE (higher is better)."""
    by_scenario: dict[tuple, list[dict]] = defaultdict(list)
    for e in entries:
        e["frontier"] = None
        if e.get("utility_loss") is not None and (e.get("ev_linkage") is not None or e.get("mse") is not None):
            by_scenario[tuple(e[k] for k in SCENARIO_KEYS)].append(e)
    for members in by_scenario.values():
        by_linkage = all(e.get("ev_linkage") is not None for e in members)
        members = [e for e in members if by_linkage or e.get("mse") is not None]

        def safety(e: dict) -> float:  # larger is safer
            return -e["ev_linkage"] if by_linkage else e["mse"]
        for e in members:
            e["frontier"] = not any(
                (o["utility_loss"] <= e["utility_loss"] and safety(o) > safety(e))
                or (o["utility_loss"] < e["utility_loss"] and safety(o) >= safety(e))
                for o in members if o is not e)
