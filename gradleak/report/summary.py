"""The report's first screen: per scenario (dataset, model, batch size, local steps) one table
of its defense settings, each threat model's grade as a coloured chip beside the evidence the
grade rests on (linkage AUC and recognizable rate with their 95% intervals), the utility loss
with its interval and whether it lies within the study's utility budget."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..analysis import GRADES, SCENARIO_KEYS, answer, is_within, loss_high, percent, setting_name
from .words import THREAT_SHORT_TITLES, by_threat, scenario_words, threat_title

# a table per scenario less its threat model: the threat models are column groups side by side
TABLE_KEYS = tuple(k for k in SCENARIO_KEYS if k != "threat")
# the chip's class per grade; fixed names, never a store's text (the page's CSS colours them)
CHIP_CLASSES = {"copies": "copies", "recognizable": "recognizable", "linkable": "linkable", "holds": "holds",
                "not shown": "unshown"}


def _row_key(entry: dict) -> tuple:
    """A table row's setting: its scenario less the threat model, its defense and strength."""
    return (*[entry[k] for k in TABLE_KEYS], entry["defense"], entry["strength"])


@dataclass
class Chip:
    text: str  # the grade in words: the colour is never the only signal
    css_class: str


@dataclass
class ThreatCells:
    """One threat model's verdict on a setting: a chip and the evidence behind it."""

    chip: Chip | None  # None: the setting was not attacked under this threat model
    linkage: str = "–"
    recognizable: str = "–"


@dataclass
class SummaryRow:
    setting: str
    epsilon: str
    threats: list[ThreatCells]
    utility: str
    unusable: bool
    within: str  # "yes", "no", or "–" (no budget, or no utility measured)
    named: list[str] = field(default_factory=list)  # the threat models whose answer names this setting


@dataclass
class SummaryTable:
    title: str
    threats: list[str]  # the column groups' headings
    dp: bool  # some row is a DP defense: its ε gets a column
    budget: str | None  # the study's utility budget, in the heading of its column
    rows: list[SummaryRow] = field(default_factory=list)


def grade_chip(entry: dict) -> Chip:
    """The grade a setting got: copies / recognizable / linkable, holds, or not shown."""
    grade = entry.get("grade")
    word = grade if grade in GRADES else "holds" if entry.get("verdict") == "holds" else "not shown"
    return Chip(word, CHIP_CLASSES[word])


def within_text(entry: dict) -> str:
    budget = entry.get("utility_budget")
    if budget is None or loss_high(entry) is None:
        return "–"
    return "yes" if is_within(entry, budget) else "no"


def _threat_cells(entry: dict) -> ThreatCells:
    cells = ThreatCells(grade_chip(entry))
    if entry.get("ev_examples"):
        cells.linkage = (f"{entry['ev_linkage']:.2f} ({entry['ev_linkage_low']:.2f}–"
                         f"{entry['ev_linkage_high']:.2f})")
        cells.recognizable = (f"{entry['ev_recognizable']} of {entry['ev_examples']} "
                              f"({percent(entry['ev_recognizable_low'])[:-1]}–"
                              f"{percent(entry['ev_recognizable_high'])})")
    return cells


def _utility_text(entry: dict) -> str:
    loss = entry.get("utility_loss")
    if loss is None:
        return "unknown" if entry.get("utility_note") else "–"
    spread = entry.get("utility_loss_ci")
    return f"{loss:.3g}" + (f" ± {spread:.2g}" if spread is not None and entry.get("defense") != "none" else "")


def _privacy_text(entry: dict) -> str:
    """A DP setting's ε and, beside it, the reconstruction-robustness bound it implies: the
    largest re-identification rate any attacker can reach (gradleak.rero)."""
    epsilon, bound = entry.get("epsilon"), entry.get("rero_bound")
    if epsilon is None:
        return "–"
    return f"{epsilon:.3g}" + (f" ({bound:.2g})" if bound is not None else "")


def _short_title(threat: str) -> str:
    return threat_title(threat, THREAT_SHORT_TITLES)


def summary_tables(entries: list[dict]) -> list[SummaryTable]:
    """One table per scenario; its rows the defense settings in the order the analysis gives
    them, its column groups the threat models (honest first)."""
    threats = by_threat(entries)
    # (scenario, defense, strength) → the threat models whose answer names the setting
    named: dict[tuple, list[str]] = defaultdict(list)
    for a in answer(entries):
        for e in a.get("named", []):
            named[_row_key(e)].append(_short_title(e["threat"]))
    scenarios: dict[tuple, dict[tuple, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for threat, members in threats.items():
        for e in members:
            scenarios[tuple(e[k] for k in TABLE_KEYS)][(e["defense"], e["strength"])][threat] = e
    tables = []
    for settings in scenarios.values():
        present = [t for t in threats if any(t in by for by in settings.values())]
        first = [next(iter(by.values())) for by in settings.values()]
        budget = next((e["utility_budget"] for e in first if e.get("utility_budget") is not None), None)
        table = SummaryTable(scenario_words(first[0]), [_short_title(t) for t in present],
                             any(e.get("epsilon") is not None for e in first),
                             None if budget is None else f"{budget:.3g}")
        for by, entry in zip(settings.values(), first):
            # utility and ε are the setting's, whatever the threat model
            table.rows.append(SummaryRow(
                setting_name(entry) or "none", _privacy_text(entry),
                [_threat_cells(by[t]) if t in by else ThreatCells(None) for t in present],
                _utility_text(entry), bool(entry.get("unusable")), within_text(entry),
                named[_row_key(entry)]))
        tables.append(table)
    return tables
