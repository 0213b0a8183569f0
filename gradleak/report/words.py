"""The verdicts in words: per threat model the answers and one sentence per defense setting
(the report's page and the command line print the same sentences), and the terminal's table."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..analysis import answer, budget_range, percent, setting_name
from ..modalities import stored_modality, table_score


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)

THREAT_TITLES = {"honest": "Honest-but-curious server", "informed": "Informed server (labels, BN statistics, "
                 "data distribution)", "malicious": "Malicious server (may modify the model it sends)"}


# the same without the gloss, for column headings (the prose says it in full)
THREAT_SHORT_TITLES = {"honest": "Honest-but-curious server", "informed": "Informed server",
                       "malicious": "Malicious server"}


def threat_title(threat: str, titles: dict[str, str] = THREAT_TITLES) -> str:
    preset, _, extra = str(threat).partition("+")
    title = titles.get(preset, f"Threat model '{threat}'")
    return f"{title}, also knowing {extra.replace('+', ', ')}" if extra else title


def by_threat(entries: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        groups[str(e.get("threat"))].append(e)
    order = list(THREAT_TITLES)
    return dict(sorted(groups.items(), key=lambda kv: (order.index(kv[0].split("+")[0])
                                                       if kv[0].split("+")[0] in order else len(order), kv[0])))


def scenario_words(e: dict) -> str:
    return (f"{e.get('dataset')}/{e.get('model')}, batch {e.get('batch_size')}, "
            f"{e.get('local_steps')} local step(s)")


@dataclass
class VerdictSection:
    """The verdict of one threat model in words: the answer per scenario first, then one
    sentence per defense setting, then notes (what stays undecided, unknown utility costs,
    the re-identification gallery)."""

    title: str
    answers: list[str]
    settings: list[str]
    notes: list[str]


def verdict_sections(entries: list[dict]) -> list[VerdictSection]:
    out = []
    answers = answer(entries)
    for threat, members in by_threat(entries).items():
        section = VerdictSection(threat_title(threat),
                                 [f"{scenario_words(a)}: {a['text']}." for a in answers if str(a["threat"]) == threat],
                                 [f"{setting_name(e)} ({scenario_words(e)}): {e['verdict_text']}." for e in members],
                                 [])
        hidden = [e for e in members if str(e.get("verdict", "")).startswith("not shown")]
        if hidden:
            section.notes.append(f"Undecided: {len(hidden)} of {len(members)} settings (reasons above).")
        notes = sorted({f"{e.get('dataset')}/{e.get('model')}: {e['utility_note']}" for e in members
                        if e.get("utility_note")})
        if notes:
            section.notes.append("Utility cost unknown — " + "; ".join(notes) + ": no defense's cost is measured, "
                                 "so none is shown to be free.")
        galleries = sorted({str(e["gallery_note"]) for e in members if e.get("gallery_note")})
        if galleries:
            section.notes.append("Re-identified among: " + "; ".join(galleries) + ".")
        out.append(section)
    return out


def verdict_in_words(entries: list[dict]) -> list[tuple[str, list[str]]]:
    """Per threat model, its verdict as lines: the answers, the settings' sentences, the notes."""
    return [(s.title, s.answers + s.settings + s.notes) for s in verdict_sections(entries)]


def with_words(entry: dict, full: bool = False) -> dict:
    """The entry with its grade, evidence, re-identification and budget in words; `full` adds
    the intervals and the gallery it was measured among (the report's table)."""
    reid = None
    if entry.get("identified") is not None:
        chance = f"chance {percent(entry.get('reid_chance') or 0)}"
        if full and entry.get("gallery_note"):
            chance += f"; among {entry['gallery_note']}"
        reid = f"{entry['identified']} of {entry['identified_of']} ({chance})"
    linkage = recognizable = None
    if entry.get("ev_examples"):
        linkage = f"{entry['ev_linkage']:.2f}"
        recognizable = f"{entry['ev_recognizable']} of {entry['ev_examples']}"
        if full:
            linkage += f" ({entry['ev_linkage_low']:.2f}–{entry['ev_linkage_high']:.2f})"
            recognizable += f" ({percent(entry['ev_recognizable_low'])[:-1]}–{percent(entry['ev_recognizable_high'])})"
    grade = entry.get("grade") or ("holds" if entry.get("verdict") == "holds" else "–")
    examples = entry.get("min_examples")
    rungs = entry.get("sample_rungs") or 0
    evidence = (f"{examples}" + (f" ({rungs} sample rung{'s' if rungs != 1 else ''})" if rungs else "")
                if examples else None)
    return {**entry, "reid_text": reid, "budget_text": budget_range(entry), "grade_text": grade,
            "linkage_text": linkage, "recognizable_text": recognizable, "evidence_text": evidence}


def format_strongest(entries: list[dict], modalities: dict[str, str] | None = None) -> str:
    """The verdicts for the terminal: per threat model the answer, then a table of the
    strongest attack per setting with its verdict in words. `modalities`: each dataset's
    modality (`analysis.dataset_modalities`; without it, every dataset is read as pictures)."""
    blocks = []
    answers = answer(entries)
    kinds = modalities or {}
    for threat, members in by_threat(entries).items():
        # the leakage score the settings' data share (ROUGE-1 for token sequences), else PSNR
        score = table_score(stored_modality(kinds.get(str(e.get("dataset")))) for e in members)
        cols = [("batch_size", "B"), ("local_steps", "T"), ("defense", "defense"), ("strength", "strength"),
                ("utility_loss", "util.loss"), (score.key, f"best {score.title}"),
                (f"best_{score.key}", "by"), ("grade_text", "grade"), ("linkage_text", "linkage"),
                ("recognizable_text", "recognizable"), ("budget_text", "budget"), ("verdict_text", "verdict")]
        head = [threat_title(threat)] + [f"  {scenario_words(a)}: {a['text']}" for a in answers
                                          if str(a["threat"]) == threat]
        rows = [[fmt(e.get(k), 3) for k, _ in cols] for e in map(with_words, members)]
        widths = [max(len(t), *(len(r[i]) for r in rows)) for i, (_, t) in enumerate(cols)]
        line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
        blocks.append("\n".join(head + [line([t for _, t in cols])] + [line(r) for r in rows]))
    for note in sorted({f"{e.get('dataset')}/{e.get('model')}: {e['utility_note']}" for e in entries
                        if e.get("utility_note")}):
        blocks.append(f"util.loss – : {note}; no utility cost is shown")
    return "\n\n".join(blocks)


