"""The words of a verdict: the sentence per defense setting and the answer line per scenario,
from the entries `analysis.verdict` grades (the terminal, the report and `summary()` print these)."""
from __future__ import annotations

from collections import defaultdict

from ..leakage import Evidence, Tolerance
from .cells import SCENARIO_KEYS

HOLDS_MIN_SEEDS = 2  # "holds" needs at least this many seeds


def attack_name(row: dict) -> str:
    return row["attack_spec"] + (f" (as the {row['from_threat']} server)" if row.get("from_threat") else "")


def unconfirmed_text(member: dict) -> str:
    evidence: Evidence = member["evidence"]
    return (f"{count_text(evidence.recognizable, evidence.examples)} recognizable by {attack_name(member)} "
            "(borderline, not confirmed on fresh examples: not called a leak)")


def recognizable_within(recognised: list[dict]) -> str | None:
    """The attack with the most examples recognizable beyond chance, where the tolerance is
    met all the same: "13 of 800 examples recognizable by ATTACK (beyond chance)"; None for none."""
    if not recognised:
        return None
    member = max(recognised, key=lambda m: m["evidence"].recognizable)
    evidence: Evidence = member["evidence"]
    return (f"{count_text(evidence.recognizable, evidence.examples)} recognizable by {attack_name(member)} "
            "(beyond chance)")


def entry_tolerance(entry: dict) -> Tolerance:
    stored = entry.get("tolerance")
    return Tolerance(**stored) if isinstance(stored, dict) else Tolerance()


def percent(rate: float | None) -> str:
    """A rate as the verdicts print it (0.001998 → "0.2%", 0.376 → "38%", 1.0 → "100%")."""
    if rate is None:
        return "–"
    value = 100 * rate
    return f"{value:.0f}%" if value >= 10 else f"{value:.2g}%"


def count_text(k: int, n: int) -> str:
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


def _interval(low: float, high: float, as_percent: bool = False) -> str:
    return (f"{percent(low)[:-1]}–{percent(high)}" if as_percent else f"{low:.2f}–{high:.2f}")


def _evidence_text(entry: dict) -> str:
    """The grading attack's numbers: linkage AUC and recognizable rate with their intervals."""
    n = entry.get("ev_examples") or 0
    if not n:
        return "no example judged against a gallery"
    level = f"{100 * entry_tolerance(entry).level:g}%"
    linkage = _interval(entry["ev_linkage_low"], entry["ev_linkage_high"])
    top1 = ""
    if entry.get("ev_identified_low") is not None:
        top1 = (f"{entry.get('ev_identified') or 0} of {n} re-identified top-1 "
                f"({_interval(entry['ev_identified_low'], entry['ev_identified_high'], True)}), ")
    return (f"linkage AUC {entry['ev_linkage']:.2f} ({level} {linkage}), {top1}"
            f"{count_text(entry['ev_recognizable'], n)} recognizable "
            f"({_interval(entry['ev_recognizable_low'], entry['ev_recognizable_high'], True)}; "
            f"chance {percent(entry['ev_chance'])})")


def verdict(entry: dict) -> tuple[str, str]:
    """('leaks' | 'linkable' | 'holds' | 'not shown (why)', the verdict in one sentence); a
    borderline recognizable count that was not confirmed is said beside it."""
    word, text = _verdict(entry)
    note = entry.get("unconfirmed_recognizable")
    return word, (f"{text}; {note}" if note and word != "leaks" else text)


def _verdict(entry: dict) -> tuple[str, str]:
    grade, attack = entry.get("grade"), entry.get("grade_attack")
    tolerance = entry_tolerance(entry)
    borderline = " (borderline: not yet confirmed on fresh examples)" if entry.get("borderline") else ""
    if grade == "copies":
        return "leaks", (f"leaks: {count_text(entry['ev_copies'], entry['ev_copies_of'])} copied exactly "
                         f"({entry.get('copy_criterion') or 'MSE ≤ 1e-3'}) by {attack}")
    if grade == "recognizable":
        return "leaks", (f"leaks: recognizable reconstructions by {attack}{borderline} — {_evidence_text(entry)}")
    if grade == "linkable":
        return "linkable", (f"linkable, not recognizable: reconstructions by {attack} are nearer their originals "
                            f"than chance{borderline}, beyond the tolerance — {_evidence_text(entry)}")
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
    if not entry.get("meets_tolerance"):
        if entry.get("linkable_open"):
            # nearer their originals than chance, but not placed on either side of the tolerance
            return "not shown (rates not bounded)", (
                f"not shown: measurably linkable, not recognizable — reconstructions by {attack} are nearer their "
                f"originals than chance ({_evidence_text(entry)}), but {_unbounded(entry, tolerance)}")
        return "not shown (rates not bounded)", f"not shown: {_unbounded(entry, tolerance)}"
    within = (["measurably linkable"] if entry.get("linkable_within") else []) + (
        [entry["recognizable_within"]] if entry.get("recognizable_within") else [])
    linkable = f" — {' and '.join(within)}, within the tolerance" if within else ""
    return "holds", (f"holds at the tolerance ({tolerance.describe()}) against {against} (saturated at "
                     f"{_budget_text(entry)}; over {entry['min_examples']} or more examples per attack the linkage "
                     f"AUC is at most {entry['worst_linkage_high']:.2f} and the recognizable rate at most "
                     f"{percent(entry['worst_recognizable_high'])}){linkable}")


def _unbounded(entry: dict, tolerance) -> str:
    """How far the examples so far bound the rates, and how many would bound them."""
    needed = entry.get("needed_examples") or 0
    more = (f"; about {needed} per attack would bound them if the rates stay as measured" if 0 < needed <= 1000
            else "; the rates as measured sit too near the tolerance for any affordable number of examples to "
            "bound them" if needed > 1000 else "")
    return (f"{entry['min_examples']} examples per attack bound the linkage AUC only to "
            f"{entry['worst_linkage_high']:.2f} and the recognizable rate to "
            f"{percent(entry['worst_recognizable_high'])} (the tolerance asks {tolerance.describe()}){more}")


# How leaky a verdict is, least first: the answer's order when nothing holds.
SEVERITY = {"holds": 0, "not shown": 1, "linkable": 2, "recognizable": 3, "copies": 4}


def severity(entry: dict) -> int:
    if entry.get("grade") in SEVERITY:
        return SEVERITY[entry["grade"]]
    return 0 if entry.get("verdict") == "holds" else 1


def setting_name(entry: dict) -> str:
    return entry["defense"] if not entry.get("strength") else f"{entry['defense']} {entry['strength']}"


def loss_text(entry: dict) -> str:
    loss = entry.get("utility_loss")
    if loss is None and entry.get("utility_metric") is None:
        return ""  # no utility runs in this store
    if loss is None:
        return ", utility cost unknown" + (f" ({entry['utility_note']})" if entry.get("utility_note") else "")
    ci = entry.get("utility_loss_ci")
    spread = f" ± {ci:.2g}" if ci is not None else ""
    budget = entry.get("utility_budget")
    # under a budget the question is which side of it the loss lies on, not whether it is told
    # from nothing: a loss of 0.002 ± 0.006 is within a budget of 0.02, and says so
    told_by_budget = budget is not None and ci is not None and not loss - ci <= budget <= loss + ci
    if entry.get("utility_resolved") is False and not told_by_budget:
        return f", utility cost not resolved (loss {loss:.3g}{spread}: its interval is as wide as the loss)"
    return f", utility loss {loss:.3g}{spread}"


def answer(entries: list[dict]) -> list[dict]:
    """The answer a practitioner came for, per scenario (threat model, dataset, model, batch
    size, local steps): the cheapest defense setting that holds at the tolerance (least utility
    loss), or the least leaky one when none holds (by grade, then by its worst attack's linkage
    AUC). With a utility budget (`utility_budget`: the loss the study accepts), what holds within
    it at 95% (`within_budget`), else both ways out. A setting under which the model no longer
    learns is said to be unusable wherever it is named. Each answer lists the settings its text
    names (`named`), whose utility losses it quotes."""
    by_scenario: dict[tuple, list[dict]] = defaultdict(list)
    for e in entries:
        by_scenario[tuple(e[k] for k in SCENARIO_KEYS)].append(e)
    out = []
    for key, members in by_scenario.items():
        holds = [e for e in members if e["verdict"] == "holds"]
        scenario = dict(zip(SCENARIO_KEYS, key))
        budget = next((e["utility_budget"] for e in members if e.get("utility_budget") is not None), None)
        if budget is not None:
            out.append({**scenario, **within_budget(members, holds, budget)})
        elif holds:
            cheapest = min(holds, key=lambda e: (e.get("utility_loss") is None, e.get("utility_loss") or 0.0))
            out.append({**scenario, "holds": True, "setting": cheapest, "named": [cheapest], "text": (
                f"cheapest defense that holds: {setting_name(cheapest)}{loss_text(cheapest)}{_unusable(cheapest)} — "
                f"{cheapest['verdict_text']}")})
        else:
            least = min(members, key=_leakiness)
            out.append({**scenario, "holds": False, "setting": least, "named": [least], "text": (
                f"none of the {len(members)} tested settings is shown to hold; the least leaky is "
                f"{setting_name(least)} ({least['verdict_text']}){loss_text(least)}{_unusable(least)}")})
    return out


def within_budget(members: list[dict], holds: list[dict], budget: float) -> dict:
    """The answer under a utility budget: the cheapest setting that holds with its utility loss's
    95% upper bound within `budget` (and a model that still learns); else "nothing tested holds
    within" it, then (a) the least leaky setting within it and (b) the cheapest that holds, with
    its cost."""
    within = [e for e in members if is_within(e, budget)]
    shippable = [e for e in holds if e in within]
    limit = f"a utility loss of {budget:.3g} (at 95%)"
    if shippable:
        best = min(shippable, key=lambda e: e["utility_loss"])
        return {"holds": True, "setting": best, "named": [best], "text": (
            f"within {limit}, the cheapest defense that holds: {setting_name(best)}{loss_text(best)} — "
            f"{best['verdict_text']}")}
    parts = [f"nothing tested holds within {limit}"]
    least = min(within, key=_leakiness) if within else None
    if least is not None:
        parts.append(f"within it, the least leaky is {setting_name(least)}{loss_text(least)} "
                     f"({least['verdict_text']})")
    else:
        parts.append("no tested setting's utility loss is shown to be within it")
    cheapest = None
    if holds:
        cheapest = min(holds, key=lambda e: (e.get("utility_loss") is None, e.get("utility_loss") or 0.0))
        parts.append(f"the cheapest that holds is {setting_name(cheapest)}{loss_text(cheapest)}"
                     f"{_unusable(cheapest)}")
    else:
        parts.append(f"none of the {len(members)} tested settings holds at any cost")
    named = [e for e in (least, cheapest) if e is not None]
    return {"holds": False, "setting": least, "named": named, "text": "; ".join(parts)}


def is_within(entry: dict, budget: float) -> bool:
    """Whether a setting is within a utility budget: its loss's 95% upper bound at most the
    budget, and a model that still learns."""
    high = loss_high(entry)
    return high is not None and high <= budget and not entry.get("unusable")


def loss_high(entry: dict) -> float | None:
    """The utility loss's 95% upper bound; the undefended run's is 0, its loss against itself."""
    loss = entry.get("utility_loss")
    if loss is None:
        return None
    if entry.get("defense") == "none":
        return 0.0
    return loss + (entry.get("utility_loss_ci") or 0.0)


def _unusable(entry: dict) -> str:
    return f" — unusable: {entry['unusable']}" if entry.get("unusable") else ""


def _leakiness(entry: dict):
    """Sort key, least leaky first: the grade, then the copy rate, then the worst attack's
    linkage AUC (its estimate: the interval's upper end moves more with the examples' spread)."""
    copy_rate = (entry.get("ev_copies") or 0) / (entry.get("ev_copies_of") or 1)
    worst = entry.get("worst_linkage")
    return (severity(entry), copy_rate, worst if worst is not None else 1.0, entry.get("worst_linkage_high") or 1.0)
