"""The verdict per defense setting, and the answer per scenario.

Liu et al.'s criterion (Eq. 3): a defense is as strong as its error against the most
effective attack, so per setting every attack's evidence is weighed and the worst counts.
The grades, strongest first (gradleak.leakage says how each is measured and tested):

- **copies** — some attack reconstructed an example exactly: *leaks*;
- **recognizable** — some attack's reconstructions re-identify their originals and pass the
  perceptual bar more often than chance allows (Holm-corrected over the setting's attacks and
  both tests): *leaks*;
- **linkable** — reconstructions are measurably nearer their originals than chance (linkage
  AUC above 0.5, Holm-corrected), none shown recognizable, and the tolerance is not met;
- **holds** — the user's tolerance (`leakage.Tolerance`) is met by every attack: its
  linkage AUC and recognizable rate are bounded within it at the stated level, every attack
  ended its budget ladder saturated (or is analytic), at least two seeds ran, no cell failed,
  and every captured update was reproduced by the declared training;
- **not shown**, with the reason (including how far the examples so far bound the rates).

A significant result with a corrected p-value near the level is *borderline*: the sample
ladder (gradleak.sweep.samples) confirms it on fresh examples before the answer rests on it.
"""
from __future__ import annotations

from collections import defaultdict

from ..leakage import BORDERLINE_FRACTION, Evidence, Tolerance, holm
from ..store import CellRecord
from .cells import SCENARIO_KEYS
from .costs import mark_frontier, utility_loss, utility_metric, utility_table
from .rows import attack_rows, failures, with_weaker_threats

HOLDS_MIN_SEEDS = 2
# Grades of leakage, strongest first; "holds" is the grade of a setting that met the tolerance.
GRADES = ("copies", "recognizable", "linkable")
# metric → True when a larger value means a better reconstruction (stronger attack)
ATTACK_METRICS = {"mse": False, "psnr": True, "ssim": True, "lpips": False, "asr": True,
                  "rouge1": True, "rouge2": True, "linkage": True, "recognizable": True}


def study_tolerance(cells: list[CellRecord], tolerance: Tolerance | None = None) -> Tolerance:
    """The tolerance a study was run with (stored with its cells), unless one is given."""
    if tolerance is not None:
        return tolerance
    from ..leakage import parse_tolerance

    for c in cells:
        stored = c.labels.get("tolerance") if isinstance(c.labels, dict) else None
        if isinstance(stored, (str, dict)):
            return parse_tolerance(stored)
    return Tolerance()


def strongest_attacks(cells: list[CellRecord], tolerance: Tolerance | None = None) -> list[dict]:
    """Liu et al. Eq. (3) per scenario × defense × strength, with the verdict (grade, holds or
    not shown), the evidence it rests on, utility loss and frontier flags."""
    tolerance = study_tolerance(cells, tolerance)
    rows = with_weaker_threats(attack_rows(cells))
    utilities = utility_table(cells)
    metric = utility_metric(utilities)
    failed = failures(cells)
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
        entry.update(judge(members, tolerance))
        entry["failed"] = failed.get(key, 0)
        entry["training_unconfirmed"] = max(m.get("training_unconfirmed", 0) for m in members)
        blind = [m for m in members if m.get("training_blind")]
        entry["blind_only"] = len(blind) == len(members)
        entry["blind_note"] = (f"{blind[0]['attack_spec']} {blind[0]['training_blind']}" if blind else None)
        entry["verdict"], entry["verdict_text"] = verdict(entry)
        entry["open"] = still_open(entry)
        entry.update(utility_loss(entry, utilities, metric))
        out.append(entry)
    mark_frontier(out)
    return out


def attack_name(row: dict) -> str:
    return row["attack_spec"] + (f" (as the {row['from_threat']} server)" if row.get("from_threat") else "")


def judge(members: list[dict], tolerance: Tolerance) -> dict:
    """The grade of one setting from its attacks' evidence: copies, then recognizable and linkable
    by Holm-corrected tests over every attack × both tests, then whether every attack meets
    the tolerance. Returns the grade, the attack it rests on, its evidence in numbers and the
    facts `verdict` words."""
    alpha = 1 - tolerance.level
    judged = [m for m in members if m["evidence"].examples]
    tests = [(m, kind, p) for m in judged
             for kind, p in (("recognizable", m["evidence"].recognizable_p()), ("linkage", m["evidence"].linkage_p()))]
    adjusted = holm([p for _, _, p in tests])
    significant = {(id(m), kind): q for (m, kind, _), q in zip(tests, adjusted) if q <= alpha}
    copied = [m for m in members if m["evidence"].copies]
    # a leak is called only when it is decisive; a borderline one (corrected p between a tenth of
    # the level and the level) must first be confirmed on fresh examples (the sample ladder adds
    # them while it is borderline), else it is reported as unconfirmed and the grade falls through
    decisive = alpha * BORDERLINE_FRACTION
    recognised = [m for m in judged if significant.get((id(m), "recognizable"), 1.0) <= decisive]
    unconfirmed = [m for m in judged if (id(m), "recognizable") in significant and m not in recognised]
    linked = [m for m in judged if (id(m), "linkage") in significant]
    meets = bool(judged) and len(judged) == len(members) and all(m["evidence"].meets(tolerance) for m in members)
    if copied:
        grade, best = "copies", max(copied, key=lambda m: m["evidence"].copies / max(m["evidence"].copies_of, 1))
    elif recognised:
        grade, best = "recognizable", min(recognised, key=lambda m: significant[(id(m), "recognizable")])
    elif linked and not meets:
        grade, best = "linkable", max(linked, key=lambda m: m["evidence"].linkage_interval(tolerance.level)[0])
    else:
        grade = None
        # the attack that comes closest to breaking the tolerance: the highest upper bounds
        best = max(members, key=lambda m: (m["evidence"].linkage_interval(tolerance.level)[1],
                                           m["evidence"].recognizable_interval(tolerance.level)[1]))
    q = significant.get((id(best), "recognizable" if grade == "recognizable" else "linkage"))
    evidence: Evidence = best["evidence"]
    return {"grade": grade, "grade_attack": attack_name(best), "tolerance": tolerance.to_dict(),
            "borderline": q is not None and grade in ("recognizable", "linkable") and q > alpha * BORDERLINE_FRACTION,
            "p_adjusted": q, "tests": len(tests), "meets_tolerance": meets,
            "unconfirmed_recognizable": None if grade in ("copies", "recognizable") or not unconfirmed else
            _unconfirmed_text(min(unconfirmed, key=lambda m: significant[(id(m), "recognizable")])),
            "linkable_within": bool(linked) and meets,
            "exceeds_tolerance": any(m["evidence"].exceeds(tolerance) for m in members),
            **{f"ev_{k}": v for k, v in evidence.summary(tolerance.level).items()},
            "examples": best.get("examples"), "copies": best.get("copies"),
            "copy_criterion": best.get("copy_criterion"),
            "identified": best.get("identified"), "identified_of": best.get("identified_of"),
            "reid_chance": best.get("reid_chance"),
            "min_examples": min((m["evidence"].examples for m in members), default=0),
            "needed_examples": max((m["evidence"].examples_needed(tolerance) for m in members), default=0),
            "worst_linkage_high": max((m["evidence"].linkage_interval(tolerance.level)[1] for m in judged),
                                      default=None),
            "worst_linkage": max((m["evidence"].linkage for m in judged), default=None),
            "worst_recognizable_high": max((m["evidence"].recognizable_interval(tolerance.level)[1] for m in judged),
                                           default=None),
            "reid_judged": len(judged) == len(members),
            "gallery_note": next((m.get("gallery_note") for m in members if m.get("gallery_note")), None),
            "unsaturated": ", ".join(sorted(attack_name(m) for m in members if not m.get("saturated"))) or None,
            "budget_min": min((m["budget_min"] for m in members if m.get("budget_min")), default=None),
            "budget_max": max((m["budget_max"] for m in members if m.get("budget_max")), default=None),
            "sample_rungs": max((m.get("sample_rungs") or 0 for m in members), default=0),
            "attack_specs": sorted(attack_name(m) for m in members)}


def _unconfirmed_text(member: dict) -> str:
    evidence: Evidence = member["evidence"]
    return (f"{count_text(evidence.recognizable, evidence.examples)} recognizable by {attack_name(member)} "
            "(borderline, not confirmed on fresh examples: not called a leak)")


def still_open(entry: dict) -> bool:
    """Whether more examples could change the setting's verdict: no copy; a recognizable count
    not yet confirmed, or no recognizable or linkable grade that is decided (significant and not
    borderline; a linkable one beyond the tolerance); the tolerance not yet met; nothing else (a
    failure, an unconfirmed training, an unsaturated attack, no gallery) keeping it from holding."""
    if entry.get("grade") == "copies" or entry.get("meets_tolerance") and entry["verdict"] == "holds":
        return False
    if entry.get("failed") or entry.get("training_unconfirmed") or entry.get("blind_only") \
            or entry.get("unsaturated"):
        return False
    if entry.get("unconfirmed_recognizable"):
        return True
    if entry.get("grade") == "recognizable" and not entry.get("borderline"):
        return False
    if entry.get("grade") == "linkable" and entry.get("exceeds_tolerance") and not entry.get("borderline"):
        return False
    return bool(entry.get("reid_judged"))


def _tolerance(entry: dict) -> Tolerance:
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
    level = f"{100 * _tolerance(entry).level:g}%"
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
    tolerance = _tolerance(entry)
    borderline = " (borderline: not yet confirmed on fresh examples)" if entry.get("borderline") else ""
    if grade == "copies":
        return "leaks", (f"leaks: {count_text(entry['ev_copies'], entry['ev_copies_of'])} copied exactly "
                         f"({entry.get('copy_criterion') or 'MSE ≤ 1e-3'}) by {attack}")
    if grade == "recognizable":
        return "leaks", (f"leaks: recognizable reconstructions by {attack}{borderline} — {_evidence_text(entry)}")
    if grade == "linkable":
        beyond = ("beyond the tolerance" if entry.get("exceeds_tolerance")
                  else f"the tolerance not met (it asks {tolerance.describe()})")
        return "linkable", (f"linkable, not recognizable: reconstructions by {attack} are nearer their originals "
                            f"than chance{borderline}, {beyond} — {_evidence_text(entry)}")
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
        needed = entry.get("needed_examples") or 0
        more = (f"; about {needed} per attack would bound them if the rates stay as measured" if 0 < needed <= 1000
                else "; the rates as measured sit too near the tolerance for any affordable number of examples to "
                "bound them" if needed > 1000 else "")
        return ("not shown (rates not bounded)",
                f"not shown: {entry['min_examples']} examples per attack bound the linkage AUC only to "
                f"{entry['worst_linkage_high']:.2f} and the recognizable rate to "
                f"{percent(entry['worst_recognizable_high'])} (the tolerance asks {tolerance.describe()}){more}")
    linkable = (" — measurably linkable, within the tolerance" if entry.get("linkable_within") else "")
    return "holds", (f"holds at the tolerance ({tolerance.describe()}) against {against} (saturated at "
                     f"{_budget_text(entry)}; over {entry['min_examples']} or more examples per attack the linkage "
                     f"AUC is at most {entry['worst_linkage_high']:.2f} and the recognizable rate at most "
                     f"{percent(entry['worst_recognizable_high'])}){linkable}")


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
    if entry.get("utility_resolved") is False:
        return f", utility cost not resolved (loss {loss:.3g}{spread}: its interval is as wide as the loss)"
    return f", utility loss {loss:.3g}{spread}"


def answer(entries: list[dict]) -> list[dict]:
    """The answer a practitioner came for, per scenario (threat model, dataset, model, batch
    size, local steps): the cheapest defense setting that holds at the tolerance (least utility
    loss), or the least leaky one when none holds (by grade, then by its worst attack's linkage
    AUC)."""
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
                f"cheapest defense that holds: {setting_name(cheapest)}{loss_text(cheapest)} — "
                f"{cheapest['verdict_text']}")})
        else:
            least = min(members, key=_leakiness)
            out.append({**scenario, "holds": False, "setting": least, "text": (
                f"none of the {len(members)} tested settings is shown to hold; the least leaky is "
                f"{setting_name(least)} ({least['verdict_text']}){loss_text(least)}")})
    return out


def _leakiness(entry: dict):
    """Sort key, least leaky first: the grade, then the copy rate, then the worst attack's
    linkage AUC (its estimate: the interval's upper end moves more with the examples' spread)."""
    copy_rate = (entry.get("ev_copies") or 0) / (entry.get("ev_copies_of") or 1)
    worst = entry.get("worst_linkage")
    return (severity(entry), copy_rate, worst if worst is not None else 1.0, entry.get("worst_linkage_high") or 1.0)
