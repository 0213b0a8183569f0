"""The grade per defense setting from its attacks' evidence (the words: `analysis.wording`).

Liu et al.'s criterion (Eq. 3): a defense is as strong as its error against the most
effective attack, so per setting every attack's evidence is weighed and the worst counts.
The grades, strongest first (gradleak.leakage says how each is measured and tested):

- **copies** — some attack reconstructed an example exactly: *leaks*;
- **recognizable** — some attack's reconstructions re-identify their originals and pass the
  perceptual bar more often than chance allows (Holm-corrected over the setting's attacks and
  both tests), and the tolerance is not met: *leaks*; within the tolerance (a few of hundreds)
  it may *hold*, and the verdict names the count;
- **linkable** — reconstructions are measurably nearer their originals than chance (linkage
  AUC above 0.5, Holm-corrected), none shown recognizable, and the linkage is shown beyond the
  tolerance (its interval's lower end above it); measurably linkable but not yet placed on
  either side of the tolerance is *not shown* (and says so), within it may *hold*;
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
from .costs import mark_frontier, privacy_bound, utility_loss, utility_metric, utility_table
from .rows import attack_rows, failures, with_weaker_threats
from .wording import attack_name, recognizable_within, unconfirmed_text, verdict

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


def study_utility_budget(cells: list[CellRecord]) -> float | None:
    """The utility loss a study accepts (`utility.max_loss`, stored with its cells), if it set one."""
    for c in cells:
        stored = c.labels.get("utility_budget") if isinstance(c.labels, dict) else None
        if isinstance(stored, (int, float)) and not isinstance(stored, bool):
            return float(stored)
    return None


def strongest_attacks(cells: list[CellRecord], tolerance: Tolerance | None = None,
                      utility_budget: float | None = None) -> list[dict]:
    """Liu et al. Eq. (3) per scenario × defense × strength, with the verdict (grade, holds or
    not shown), the evidence it rests on, utility loss and frontier flags."""
    tolerance = study_tolerance(cells, tolerance)
    budget = utility_budget if utility_budget is not None else study_utility_budget(cells)
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
        entry.update(privacy_bound(entry, utilities, members))
        if budget is not None:
            entry["utility_budget"] = budget
        out.append(entry)
    mark_frontier(out)
    return out


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
    # linkable is a grade of leakage where it is beyond the tolerance (the interval's lower end
    # above it): an AUC the user accepts is no leak, one not yet placed is not shown
    beyond = [m for m in linked if m["evidence"].linkage_exceeds(tolerance)]
    meets = bool(judged) and len(judged) == len(members) and all(m["evidence"].meets(tolerance) for m in members)
    if copied:
        grade, best = "copies", max(copied, key=lambda m: m["evidence"].copies / max(m["evidence"].copies_of, 1))
    elif recognised and not meets:
        # recognizable beyond chance is a leak unless the tolerance, which bounds the recognizable
        # rate the user accepts, is met at its level: a few legible digits of hundreds then hold,
        # and the verdict says how many
        grade, best = "recognizable", min(recognised, key=lambda m: significant[(id(m), "recognizable")])
    elif beyond:
        grade, best = "linkable", max(beyond, key=lambda m: m["evidence"].linkage_interval(tolerance.level)[0])
    elif linked and not meets:
        # nearer their originals than chance, but not shown beyond what the user accepts: not a
        # leak under the tolerance, and not shown to hold either (the verdict says both)
        grade, best = None, max(linked, key=lambda m: m["evidence"].linkage_interval(tolerance.level)[0])
    else:
        grade = None
        # the attack that comes closest to breaking the tolerance: the highest upper bounds
        best = max(members, key=lambda m: (m["evidence"].linkage_interval(tolerance.level)[1],
                                           m["evidence"].recognizable_interval(tolerance.level)[1]))
    # What the sample ladder extends. Where some attack measures linkage at or above the
    # tolerance, only one of those: its examples alone can decide the setting as beyond the
    # tolerance, and while it measures there no number of the others' examples makes the setting
    # hold — the one already given fresh examples (so a later rung goes on with the attack an
    # earlier rung chose, instead of starting another from its first few examples), else the
    # one that needs the fewest examples more to show it, then by name. Else every attack, since
    # a setting holds only when all are bounded. (The last rung also extends the others of a
    # focused setting: sweep.sample_plan.every_attack_target.) Analytic attacks come along: they
    # may still show a stronger grade (a copy) on the fresh examples. Nothing here rests on
    # measured seconds: a choice by cost followed the machine's load, and with it the examples
    # behind a grade and, on signSGD, the grade (docs/verdicts.md).
    measured_beyond = [m for m in judged if m["evidence"].linkage >= tolerance.linkage]
    focus = (min(measured_beyond, key=lambda m: (not m.get("sample_rungs"), _examples_to_exceed(m, tolerance),
                                                 m["attack_spec"]))
             if measured_beyond and not copied and not unconfirmed else None)
    extend = None if focus is None else [focus["attack_spec"]] + sorted(
        {m["attack_spec"] for m in judged if m is not focus and m.get("analytic")} - {focus["attack_spec"]})
    min_examples = min((m["evidence"].examples for m in members), default=0)
    needed_examples = max((m["evidence"].examples_needed(tolerance) for m in members), default=0)
    q = significant.get((id(best), "recognizable" if grade == "recognizable" else "linkage"))
    evidence: Evidence = best["evidence"]
    return {"grade": grade, "grade_attack": attack_name(best), "tolerance": tolerance.to_dict(),
            "borderline": q is not None and grade in ("recognizable", "linkable") and q > alpha * BORDERLINE_FRACTION,
            "p_adjusted": q, "tests": len(tests), "meets_tolerance": meets,
            "unconfirmed_recognizable": None if grade in ("copies", "recognizable") or not unconfirmed else
            unconfirmed_text(min(unconfirmed, key=lambda m: significant[(id(m), "recognizable")])),
            "linkable_within": bool(linked) and meets,
            "recognizable_within": recognizable_within(recognised) if meets else None,
            "linkable_open": grade is None and bool(linked) and not meets,
            "exceeds_tolerance": any(m["evidence"].exceeds(tolerance) for m in members),
            **{f"ev_{k}": v for k, v in evidence.summary(tolerance.level).items()},
            "examples": best.get("examples"), "copies": best.get("copies"),
            "copy_criterion": best.get("copy_criterion"),
            "identified": best.get("identified"), "identified_of": best.get("identified_of"),
            "reid_chance": best.get("reid_chance"),
            "min_examples": min_examples, "needed_examples": needed_examples,
            # what the sample ladder extends, from how many examples, towards how many
            "ladder_attacks": extend,
            "ladder_have": focus["evidence"].examples if focus else min_examples,
            "ladder_needed": focus["evidence"].examples_to_exceed(tolerance) if focus else needed_examples,
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


def _examples_to_exceed(member: dict, tolerance: Tolerance) -> int:
    """How many more examples this attack would need to show its linkage beyond the tolerance,
    if it stayed as measured."""
    evidence: Evidence = member["evidence"]
    return max(evidence.examples_to_exceed(tolerance) - evidence.examples, 1)


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
    if entry.get("grade") == "linkable" and not entry.get("borderline"):  # linkable is beyond the tolerance
        return False
    return bool(entry.get("reid_judged"))
