"""The page's pieces that show reconstructions: the matrix of best reconstructions per
setting and attack, and the gallery of every attack cell's grid or sequences."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis import SCENARIO_KEYS, cell_ladder
from ..modalities import stored_modality
from ..store import ResultStore
from ..viz import pairs_thumbnail
from .plots import Figure
from .words import fmt, threat_title

# A batch wider than this is shown in the matrix by its first THUMB_IMAGES pairs.
THUMB_IMAGES = 8


class ImageFiles:
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


def _matrix_cell(slot: dict | None, images: ImageFiles) -> MatrixCell:
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
    score = stored_modality(best.modality).score_words(m, fmt)
    if m.get("asr"):
        score += f" · ASR {fmt(m.get('asr'), 2)}"
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
    return f"batch {fmt(setting[0])}, {fmt(setting[1])} local step(s)"


def matrix_views(matrices: list[dict], images: ImageFiles) -> list[Matrix]:
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
        title = f"{threat_title(m['threat'])} · {m['dataset']} · {m['model']}"
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
    return f"{label} (batch {fmt(row[0])}, {fmt(row[1])} step(s))" if with_setting else label


@dataclass
class TextFigure:
    caption: str
    pairs: list[TextPair]


@dataclass
class GalleryGroup:
    defense: str
    figures: list[Figure]
    texts: list[TextFigure] = field(default_factory=list)


def gallery_groups(cells, images: ImageFiles) -> list[GalleryGroup]:
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
        kind = stored_modality(cell.modality)
        caption += kind.gallery_caption(cell.metrics, fmt)
        kind.shown(_GalleryView(group, cell, caption, images))
    return list(by_defense.values())


@dataclass
class _GalleryView:
    """One stored result placed in its gallery group the way its modality shows it."""

    group: GalleryGroup
    cell: Any  # a store cell
    caption: str
    images: ImageFiles

    def pictures(self) -> None:  # the grid
        self.group.figures.append(Figure(self.images.grid(self.cell), self.caption, self.caption))

    def text(self) -> None:  # the sequences beside their recovery
        self.group.texts.append(TextFigure(self.caption, text_pairs(self.cell)))


