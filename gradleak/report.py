"""A static HTML report of a results store: opens from disk, no server, no
external scripts or stylesheets; images are PNG files next to index.html."""
from __future__ import annotations

import csv
import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from .analysis import (
    HOLDS_MIN_SEEDS,
    SCENARIO_KEYS,
    answer,
    attack_rows,
    best_reconstructions,
    budget_range,
    cell_ladder,
    leakage_by_round,
    percent,
    setting_name,
    strongest_attacks,
    study_tables,
)
from .errors import GradleakError
from .store import ResultStore
from .viz import pairs_thumbnail

# The page's markup lives in templates/report.html. Autoescaping is on and every value handed to
# the template is plain text, so whatever a store holds (labels, errors, sentences of a text
# dataset) prints as text, never as markup or template code.
_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("gradleak", "templates"), autoescape=True,
                                undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


@dataclass
class TableCell:
    text: str
    left: bool  # text aligns left, numbers right


@dataclass
class TableRow:
    cells: list[TableCell]
    css_class: str = ""


@dataclass
class Table:
    titles: list[str]
    rows: list[TableRow]


# columns of one modality's scores, left out of a table where no row has a value
TEXT_COLUMNS = frozenset({"rouge1", "best_rouge1", "rouge2", "best_rouge2"})


def _table(rows: list[dict], columns: list[tuple[str, str]], row_class=None) -> Table:
    columns = [(k, t) for k, t in columns if k not in TEXT_COLUMNS or any(r.get(k) is not None for r in rows)]
    return Table([title for _, title in columns],
                 [TableRow([TableCell(_fmt(r.get(k)), isinstance(r.get(k), str)) for k, _ in columns],
                           row_class(r) if row_class else "") for r in rows])


STRONGEST_COLUMNS = [("dataset", "dataset"), ("model", "model"), ("batch_size", "batch"),
                     ("local_steps", "local steps"), ("defense", "defense"), ("strength", "strength"),
                     ("verdict", "verdict"), ("verdict_text", "in words"), ("seeds", "seeds"),
                     ("utility", "utility"), ("utility_loss", "utility loss"), ("utility_loss_ci", "±"),
                     ("utility_model", "utility trained on"),
                     ("grade_text", "grade"), ("linkage_text", "linkage AUC"),
                     ("recognizable_text", "recognizable"), ("evidence_text", "examples"),
                     ("reid_text", "re-identified"), ("budget_text", "budget"),
                     ("mse", "best MSE"), ("best_mse", "by"), ("psnr", "best PSNR"), ("psnr_ci", "±"),
                     ("best_psnr", "by"), ("ssim", "best SSIM"), ("ssim_ci", "±"), ("best_ssim", "by"),
                     ("lpips", "best LPIPS"), ("best_lpips", "by"), ("asr", "best ASR"), ("best_asr", "by"),
                     ("rouge1", "best ROUGE-1"), ("best_rouge1", "by"), ("rouge2", "best ROUGE-2"),
                     ("best_rouge2", "by"),
                     ("frontier", "frontier"), ("utility_note", "caveat")]
THREAT_TITLES = {"honest": "Honest-but-curious server", "informed": "Informed server (labels, BN statistics, "
                 "data distribution)", "malicious": "Malicious server (may modify the model it sends)"}


def _threat_title(threat: str) -> str:
    preset, _, extra = str(threat).partition("+")
    title = THREAT_TITLES.get(preset, f"Threat model '{threat}'")
    return f"{title}, also knowing {extra.replace('+', ', ')}" if extra else title


def _by_threat(entries: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        groups[str(e.get("threat"))].append(e)
    order = list(THREAT_TITLES)
    return dict(sorted(groups.items(), key=lambda kv: (order.index(kv[0].split("+")[0])
                                                       if kv[0].split("+")[0] in order else len(order), kv[0])))


def _scenario_words(e: dict) -> str:
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
    for threat, members in _by_threat(entries).items():
        section = VerdictSection(_threat_title(threat),
                                 [f"{_scenario_words(a)}: {a['text']}." for a in answers if str(a["threat"]) == threat],
                                 [f"{setting_name(e)} ({_scenario_words(e)}): {e['verdict_text']}." for e in members],
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


def _with_words(entry: dict, full: bool = False) -> dict:
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


def format_strongest(entries: list[dict]) -> str:
    """The verdicts for the terminal: per threat model the answer, then a table of the
    strongest attack per setting with its verdict in words."""
    blocks = []
    answers = answer(entries)
    for threat, members in _by_threat(entries).items():
        # the leakage score of the data: PSNR for pictures, ROUGE-1 for token sequences
        score = "rouge1" if all(e.get("psnr") is None and e.get("rouge1") is not None for e in members) else "psnr"
        cols = [("batch_size", "B"), ("local_steps", "T"), ("defense", "defense"), ("strength", "strength"),
                ("utility_loss", "util.loss"), (score, "best ROUGE-1" if score == "rouge1" else "best PSNR"),
                (f"best_{score}", "by"), ("grade_text", "grade"), ("linkage_text", "linkage"),
                ("recognizable_text", "recognizable"), ("budget_text", "budget"), ("verdict_text", "verdict")]
        head = [_threat_title(threat)] + [f"  {_scenario_words(a)}: {a['text']}" for a in answers
                                          if str(a["threat"]) == threat]
        rows = [[_fmt(e.get(k), 3) for k, _ in cols] for e in map(_with_words, members)]
        widths = [max(len(t), *(len(r[i]) for r in rows)) for i, (_, t) in enumerate(cols)]
        line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
        blocks.append("\n".join(head + [line([t for _, t in cols])] + [line(r) for r in rows]))
    for note in sorted({f"{e.get('dataset')}/{e.get('model')}: {e['utility_note']}" for e in entries
                        if e.get("utility_note")}):
        blocks.append(f"util.loss – : {note}; no utility cost is shown")
    return "\n\n".join(blocks)


def _scenario_title(key: tuple) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in zip(SCENARIO_KEYS, key))


def _rounds_plot(rows: list[dict], path: Path) -> bool:
    """PSNR of each attack per server round (mean over audited clients)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_attack: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("psnr") is not None:
            by_attack[str(r["attack"])][r["round"]].append(r["psnr"])
    if not by_attack:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for attack, per_round in sorted(by_attack.items()):
        xs = sorted(per_round)
        ax.plot(xs, [sum(per_round[x]) / len(per_round[x]) for x in xs], marker="o", label=attack)
    ax.set_xlabel("server round")
    ax.set_ylabel("PSNR of the reconstruction (dB)")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# Below this MSE (PSNR 60 dB) a reconstruction is an exact copy; analytic attacks reach 1e-16,
# which would stretch the axis over decades (or hundreds of dB) that say nothing.
PLOT_MSE_FLOOR = 1e-6
PLOT_PSNR_CAP = 60.0


def _tradeoff_plot(entries: list[dict], path: Path, title: str) -> bool:
    """Utility loss (x) against the best attack's PSNR (y, dB, linear: higher = more leaked);
    stores without PSNR (tabular data) fall back to the best MSE on a log axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [e for e in entries if e.get("mse") is not None or e.get("psnr") is not None]
    if not points:
        return False
    by_psnr = all(e.get("psnr") is not None for e in points)

    def privacy(e: dict) -> float:
        if by_psnr:
            return min(e["psnr"], PLOT_PSNR_CAP)
        return max(e["mse"], PLOT_MSE_FLOOR) if e.get("mse") is not None else math.nan

    with_utility = all(e.get("utility_loss") is not None for e in points)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    by_defense: dict[str, list[dict]] = defaultdict(list)
    for e in points:
        by_defense[e["defense"]].append(e)
    for i, (defense, members) in enumerate(sorted(by_defense.items())):
        xs = [e["utility_loss"] if with_utility else i for e in members]
        ys = [privacy(e) for e in members]
        ax.scatter(xs, ys, label=defense, s=36)
        for x, y, e in zip(xs, ys, members):
            if e["strength"]:
                ax.annotate(e["strength"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    frontier = sorted((e for e in points if e.get("frontier")), key=lambda e: e["utility_loss"])
    if with_utility and len(frontier) > 1:
        ax.plot([e["utility_loss"] for e in frontier], [privacy(e) for e in frontier], "k--", lw=0.8,
                label="frontier")
    if not with_utility:
        ax.set_xticks(range(len(by_defense)), sorted(by_defense), rotation=30, fontsize=8)
    ax.set_xlabel(f"utility loss ({points[0].get('utility_metric')})" if with_utility
                  else "defense (utility unknown: the utility model did not train)"
                  if any(e.get("utility_note") for e in points) else "defense (no utility runs in this store)")
    if by_psnr:
        ax.set_ylabel(f"best-attack PSNR, dB (higher = more leaked; ≤ {PLOT_PSNR_CAP:g})")
    else:
        ax.set_ylabel(f"best-attack MSE (higher = more private; exact copies at {PLOT_MSE_FLOOR:g})")
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# A batch wider than this is shown in the matrix by its first THUMB_IMAGES pairs.
THUMB_IMAGES = 8


class _Images:
    """Writes each image file of the report once, under a name derived from the cell key,
    never the key itself: a foreign store's key could hold markup or a path ("../")."""

    def __init__(self, out: Path, store: ResultStore):
        self.out, self.store = out, store
        self.written: dict[str, str] = {}

    def _name(self, text: str) -> str:
        return f"images/{hashlib.sha256(text.encode()).hexdigest()[:32]}.png"

    def grid(self, cell) -> str | None:
        if cell.grid_png is None:
            return None
        name = self._name(cell.key)
        if name not in self.written:
            (self.out / name).write_bytes(cell.grid_png)
            self.written[name] = cell.key
        return name

    def thumb(self, cell) -> str | None:
        batch = cell.labels.get("batch_size")
        if cell.grid_png is not None and isinstance(batch, int) and batch > THUMB_IMAGES:
            name = self._name(cell.key + "#thumb")
            if name in self.written:
                return name
            pairs = [(im.original_png, im.reconstruction_png) for im in self.store.images(cell.key)
                     if im.original_png and im.reconstruction_png]
            try:
                png = pairs_thumbnail(pairs, THUMB_IMAGES) if pairs else None
            except (ValueError, RuntimeError, OSError):  # unreadable or mismatched images: the full grid
                png = None
            if png is not None:
                (self.out / name).write_bytes(png)
                self.written[name] = cell.key
                return name
        return self.grid(cell)


@dataclass
class MatrixLine:
    text: str
    warning: bool = False


@dataclass
class Word:
    text: str
    same: bool  # part of a run the original and the recovery share (else highlighted)


@dataclass
class TextPair:
    """One attacked sequence beside what the attack recovered, word by word."""

    original: list[Word]
    recovered: list[Word]
    exact: bool


def _stored_sequences(cell) -> list[dict]:
    """The cell's stored sequence pairs (`extras.sequences`), anything malformed left out."""
    stored = cell.extras.get("sequences") if isinstance(cell.extras, dict) else None
    return [item for item in stored if isinstance(item, dict)] if isinstance(stored, list) else []


def text_pairs(cell, limit: int | None = None) -> list[TextPair]:
    """The cell's sequences (`extras.sequences`), the words of each side that the other lacks
    marked (difflib's longest matching runs of words)."""
    import difflib

    pairs = []
    for item in _stored_sequences(cell)[:limit]:
        original, recovered = str(item.get("original", "")).split(), str(item.get("recovered", "")).split()
        same_o, same_r = [False] * len(original), [False] * len(recovered)
        for block in difflib.SequenceMatcher(a=original, b=recovered, autojunk=False).get_matching_blocks():
            same_o[block.a:block.a + block.size] = [True] * block.size
            same_r[block.b:block.b + block.size] = [True] * block.size
        pairs.append(TextPair([Word(w, k) for w, k in zip(original, same_o)],
                              [Word(w, k) for w, k in zip(recovered, same_r)], bool(item.get("exact"))))
    return pairs


@dataclass
class MatrixCell:
    """An empty cell says why (`empty`); a filled one shows the best seed's thumbnail (or its
    first sequences beside their recovery) and its scores."""

    empty: str | None = None
    lines: list[MatrixLine] = field(default_factory=list)
    thumb: str | None = None
    alt: str = ""
    texts: list[TextPair] = field(default_factory=list)


@dataclass
class MatrixRow:
    label: str
    cells: list[MatrixCell]
    group: str | None = None  # the batch size and local steps this row starts, where a matrix mixes them


@dataclass
class Matrix:
    title: str
    setting: str | None  # the one batch size and local steps of all rows, said once above the table
    corner: str  # the top-left heading, "defense \ attack" or "attack \ defense"
    columns: list[str]
    rows: list[MatrixRow]
    # attacks that ran in no setting of this matrix, with why: one collapsed list under it
    not_run: list[str] = field(default_factory=list)


def _matrix_cell(slot: dict | None, images: _Images) -> MatrixCell:
    if slot is None:
        return MatrixCell(empty="not in the sweep")
    best = slot["best"]
    if best is None:
        if slot["not_run"]:
            return MatrixCell(empty=f"not run: {slot['not_run']}")
        error = slot["failed"][0] if slot["failed"] else "no result"
        error = error if len(error) <= 160 else error[:157] + "…"
        return MatrixCell(empty=f"failed: {error}")
    m, lab = best.metrics, best.labels
    if m.get("psnr") is not None:
        score = f"PSNR {_fmt(m.get('psnr'), 3)} dB · SSIM {_fmt(m.get('ssim'), 2)}"
    elif m.get("rouge1") is not None:
        score = f"ROUGE-1 {_fmt(m.get('rouge1'), 2)} · ROUGE-2 {_fmt(m.get('rouge2'), 2)}"
    else:
        score = f"MSE {_fmt(m.get('mse'), 3)}"
    if m.get("asr"):
        score += f" · ASR {_fmt(m.get('asr'), 2)}"
    lines = [MatrixLine(score)]
    if slot["seeds"] > 1:
        lines.append(MatrixLine(f"best of {slot['seeds']} seeds (seed {lab.get('seed')})"))
    ladder = cell_ladder(best)
    if ladder.get("decision") == "undecided":
        lines.append(MatrixLine(f"not saturated at {int(ladder.get('iterations') or 0):,} iterations", True))
    scores = [m.get("recognizable"), m.get("examples"), m.get("linkage")]
    if all(isinstance(v, (int, float)) for v in scores):
        lines.append(MatrixLine(f"recognizable {round(scores[0] * scores[1])} of {int(scores[1])} · "
                                f"linkage AUC {scores[2]:.2f}"))
    if slot["failed"]:
        lines.append(MatrixLine(f"{len(slot['failed'])} run(s) failed", True))
    alt = f"{lab.get('attack_spec')} under {lab.get('defense')} {lab.get('strength') or ''}: {score}"
    return MatrixCell(lines=lines, thumb=images.thumb(best), alt=alt, texts=text_pairs(best, THUMB_IMAGES))


def _setting_words(setting: tuple) -> str:
    return f"batch {_fmt(setting[0])}, {_fmt(setting[1])} local step(s)"


def _matrices(matrices: list[dict], images: _Images) -> list[Matrix]:
    views = []
    for m in matrices:
        # an attack that ran nowhere in this matrix gets no column, only a line in the list below it
        ran = [c for c in m["columns"] if any((m["cells"].get((r, c)) or {}).get("best") is not None
                                              or (m["cells"].get((r, c)) or {}).get("failed") for r in m["rows"])]
        not_run = []
        for c in m["columns"]:
            if c in ran:
                continue
            reasons = sorted({str(slot["not_run"]) for r in m["rows"]
                              if (slot := m["cells"].get((r, c))) and slot.get("not_run")})
            not_run.append(f"{c}: {'; '.join(reasons) or 'not in the sweep'}")
        m = {**m, "columns": ran}
        # rows are sorted by (batch size, local steps) first: one header per setting, never mixed
        settings = list(dict.fromkeys(r[:2] for r in m["rows"]))
        title = f"{_threat_title(m['threat'])} · {m['dataset']} · {m['model']}"
        setting = _setting_words(settings[0]) if len(settings) == 1 else None
        if len(m["columns"]) > len(m["rows"]):
            # more attacks than defense settings (an audit runs a dozen on one setting): attacks
            # as rows, so the matrix grows down the page instead of off its side
            rows = [MatrixRow(c, [_matrix_cell(m["cells"].get((r, c)), images) for r in m["rows"]])
                    for c in m["columns"]]
            views.append(Matrix(title, setting, "attack \\ defense",
                                [_row_label(r, len(settings) > 1) for r in m["rows"]], rows, not_run))
            continue
        rows, previous = [], None
        for row in m["rows"]:
            group = _setting_words(row[:2]) if len(settings) > 1 and row[:2] != previous else None
            previous = row[:2]
            rows.append(MatrixRow(_row_label(row), [_matrix_cell(m["cells"].get((row, c)), images)
                                                    for c in m["columns"]], group))
        views.append(Matrix(title, setting, "defense \\ attack", list(m["columns"]), rows, not_run))
    return views


def _row_label(row: tuple, with_setting: bool = False) -> str:
    label = str(row[2] if not row[3] else f"{row[2]} {row[3]}")
    return f"{label} (batch {_fmt(row[0])}, {_fmt(row[1])} step(s))" if with_setting else label


@dataclass
class Figure:
    src: str
    alt: str
    caption: str | None = None


@dataclass
class TextFigure:
    caption: str
    pairs: list[TextPair]


@dataclass
class GalleryGroup:
    defense: str
    figures: list[Figure]
    texts: list[TextFigure] = field(default_factory=list)


def _gallery(cells, images: _Images) -> list[GalleryGroup]:
    """Every attack cell's grid (token sequences: its sequences beside their recovery), grouped
    by defense (undefended first), then ordered as the tables are: threat model, scenario,
    strength, attack, seed."""
    grids = sorted((c for c in cells if c.kind == "attack" and (c.grid_png is not None or _stored_sequences(c))),
                   key=lambda c: (c.labels.get("defense") != "none", str(c.labels.get("defense")),
                                  *[str(c.labels.get(k, "")) for k in SCENARIO_KEYS],
                                  str(c.labels.get("strength")), str(c.labels.get("attack_spec")),
                                  str(c.labels.get("seed"))))
    by_defense: dict[str, GalleryGroup] = {}
    for cell in grids:
        lab = cell.labels
        caption = (f"{lab.get('threat', '')} · {lab.get('attack_spec')} · {lab.get('defense')} "
                   f"{lab.get('strength')} · batch {lab.get('batch_size')} · T={lab.get('local_steps')} · "
                   f"seed {lab.get('seed')} · ")
        group = by_defense.setdefault(str(lab.get("defense")), GalleryGroup(str(lab.get("defense")), []))
        if cell.grid_png is not None:
            caption += f"PSNR {_fmt(cell.metrics.get('psnr'), 3)}"
            group.figures.append(Figure(images.grid(cell), caption, caption))
        else:
            caption += f"ROUGE-1 {_fmt(cell.metrics.get('rouge1'), 2)} · ROUGE-2 {_fmt(cell.metrics.get('rouge2'), 2)}"
            group.texts.append(TextFigure(caption, text_pairs(cell)))
    return list(by_defense.values())


ROUND_COLUMNS = [("round", "round"), ("client", "client"), ("attack", "attack"), ("mse", "MSE"), ("psnr", "PSNR"),
                 ("ssim", "SSIM"), ("lpips", "LPIPS"), ("asr", "ASR"), ("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2")]
ATTACK_COLUMNS = [("attack_spec", "attack"), ("dataset", "dataset"), ("batch_size", "batch"),
                  ("local_steps", "local steps"), ("defense", "defense"), ("strength", "strength"),
                  *[(m, m.upper()) for m in ("mse", "psnr", "ssim", "lpips", "label_acc", "asr", "iterations")],
                  ("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"),
                  ("seconds", "seconds")]
SKIPPED_COLUMNS = [("attack", "attack"), ("model", "model"), ("defense", "defense"), ("reason", "reason")]
FAILED_COLUMNS = [("kind", "cell"), ("what", "attack"), ("dataset", "dataset"), ("model", "model"),
                  ("defense", "defense"), ("batch", "batch"), ("error", "error")]


def _study_columns(factor: str) -> list[tuple[str, str]]:
    return [("threat", "threat"), ("dataset", "dataset"), ("model", "model"), ("attack", "attack"),
            (factor, factor), ("asr", "ASR"), ("iterations", "iterations"), ("psnr", "PSNR"), ("cells", "cells")]


def _skipped_table(cells) -> Table | None:
    skipped = [{"attack": c.labels.get("attack_spec"), "model": c.labels.get("model"),
                "defense": c.labels.get("defense"), "reason": c.labels.get("reason")}
               for c in cells if c.kind == "skipped"]
    return _table(skipped, SKIPPED_COLUMNS) if skipped else None


def _failed_table(cells) -> Table | None:
    failed = [{"kind": c.labels.get("cell_kind"), "what": c.labels.get("attack_spec"),
               "dataset": c.labels.get("dataset"), "model": c.labels.get("model"),
               "defense": c.labels.get("defense"), "batch": c.labels.get("batch_size"),
               "error": c.extras.get("error") if isinstance(c.extras, dict) else None}
              for c in cells if c.kind == "failed"]
    return _table(failed, FAILED_COLUMNS) if failed else None


def _tradeoff_figures(entries: list[dict], out: Path) -> list[Figure]:
    """One trade-off plot per scenario (the ones with something to plot)."""
    scenarios: dict[tuple, list[dict]] = defaultdict(list)
    for e in entries:
        scenarios[tuple(e[k] for k in SCENARIO_KEYS)].append(e)
    figures = []
    for i, (key, members) in enumerate(scenarios.items()):
        name = f"tradeoff-{i}.png"
        if _tradeoff_plot(members, out / name, _scenario_title(key)):
            figures.append(Figure(name, f"trade-off {i}", _scenario_title(key)))
    return figures


def write_report(store_path: str | Path, out: str | Path, tolerance=None) -> dict:
    """Write index.html, plots, image files and CSV/JSON exports to `out`; the verdicts at
    `tolerance` (default: the one the study was run with)."""
    store = ResultStore(store_path, create=False)
    try:
        cells = store.cells()
        if not cells:
            raise GradleakError(f"store '{store_path}' holds no finished cells")
        out = Path(out)
        (out / "images").mkdir(parents=True, exist_ok=True)
        entries = strongest_attacks(cells, tolerance)
        rows = [{k: v for k, v in r.items() if k != "evidence"} for r in attack_rows(cells)]
        images = _Images(out, store)
        rounds = leakage_by_round(cells)
        gallery = _gallery(cells, images)
        page = _TEMPLATES.get_template("report.html").render(
            store_path=str(store_path),
            counts={kind: sum(c.kind == kind for c in cells) for kind in ("attack", "utility", "skipped", "failed")},
            thumb_images=THUMB_IMAGES, holds_min_seeds=HOLDS_MIN_SEEDS, psnr_cap=_fmt(PLOT_PSNR_CAP),
            verdicts=verdict_sections(entries),
            matrices=_matrices(best_reconstructions(cells), images),
            strongest=[(_threat_title(threat), _table([_with_words(e, full=True) for e in members], STRONGEST_COLUMNS,
                                                      lambda e: "frontier" if e.get("frontier") else ""))
                       for threat, members in _by_threat(entries).items()],
            tradeoffs=_tradeoff_figures(entries, out),
            rounds=_table(rounds, ROUND_COLUMNS) if rounds else None,
            rounds_plot=(Figure("rounds.png", "leakage per round")
                         if rounds and _rounds_plot(rounds, out / "rounds.png") else None),
            studies=[(factor, _table(table, _study_columns(factor))) for factor, table in study_tables(cells).items()],
            attacks=_table(rows, ATTACK_COLUMNS),
            skipped=_skipped_table(cells),
            failed=_failed_table(cells),
            gallery=gallery)
        (out / "index.html").write_text(page)
        _exports(out, cells, entries, rows, store)
        return {"out": str(out), "html": str(out / "index.html"), "cells": len(cells),
                "grids": sum(len(group.figures) for group in gallery),
                "texts": sum(len(group.texts) for group in gallery), "strongest": entries}
    finally:
        store.close()


def _write_csv(path: Path, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})


def _exports(out: Path, cells, entries, rows, store: ResultStore) -> None:
    _write_csv(out / "strongest.csv", entries)
    _write_csv(out / "attacks.csv", [{k: v for k, v in r.items() if k != "keys"} for r in rows])
    _write_csv(out / "utility.csv", [{**c.labels, **c.metrics, "seconds": c.seconds, "key": c.key}
                                     for c in cells if c.kind == "utility"])
    payload = {"strongest": entries,
               "cells": [{"key": c.key, "kind": c.kind, "sweep": c.sweep, "spec": c.spec, "labels": c.labels,
                          "metrics": c.metrics, "seconds": c.seconds,
                          "per_image": [im.metrics for im in store.images(c.key)]} for c in cells]}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))

