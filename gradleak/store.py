"""The durable results store: one SQLite file (WAL), one row per sweep cell.

A cell is keyed by the hash of its full spec, so re-running a sweep finds the
cells it already has and skips them. Each cell (its metrics, per-image scores
and PNG images) is written in one transaction: a process killed at any moment
leaves either the whole cell or nothing of it.

Each row records the modality of the data it was computed on (image, tabular or text), as
its writer declared it; the report and the analysis read it instead of guessing from the
metrics. Stores from before that column (schema version 1) still open: a writer migrates
the file once (adds the column and fills old rows by `data.modality.legacy_modality`), a
reader leaves the file as it is and applies the same legacy rule to rows it reads, as it
does to any row whose writer declared no modality.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .data.modality import legacy_modality
from .errors import StoreError
from .modalities import MODALITIES
from .options import path_kind

# "GLK1": lets us tell our file from any other SQLite database.
APPLICATION_ID = 0x474C4B31
SCHEMA_VERSION = 2
# version 1 lacks the modality column; it is read as is and migrated when opened for writing
LEGACY_SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cells (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,            -- 'attack', 'utility', 'skipped' (not applicable) or 'failed' (raised)
    sweep TEXT NOT NULL,
    spec TEXT NOT NULL,            -- JSON of the full spec (what the key hashes)
    labels TEXT NOT NULL,          -- JSON: defense / strength / attack labels for analysis
    metrics TEXT NOT NULL,         -- JSON summary metrics
    extras TEXT NOT NULL,          -- JSON attack/utility extras
    seconds REAL NOT NULL,
    cpu_seconds REAL,              -- process CPU time of the cell (wall time is inflated on a busy machine)
    grid_png BLOB,                 -- originals (top) vs reconstructions (bottom)
    finished REAL NOT NULL,
    modality TEXT                  -- 'image', 'tabular' or 'text' as the writer declared it; NULL: not known
);
CREATE TABLE IF NOT EXISTS images (
    cell_key TEXT NOT NULL REFERENCES cells(key) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    metrics TEXT NOT NULL,         -- JSON per-image scores
    original_png BLOB,
    reconstruction_png BLOB,
    PRIMARY KEY (cell_key, idx)
);
"""


@dataclass
class CellRecord:
    key: str
    kind: str
    sweep: str
    spec: dict
    labels: dict
    metrics: dict
    extras: dict
    seconds: float
    grid_png: bytes | None = None
    cpu_seconds: float | None = None
    # the attacked data's modality ("image", "tabular", "text"), as its writer declared it;
    # None where no one knows (a failed cell, an old row without evidence)
    modality: str | None = None


@dataclass
class ImageRecord:
    idx: int
    metrics: dict
    original_png: bytes | None
    reconstruction_png: bytes | None


class ResultStore:
    """Open (or create) a results database. Raises GradleakError with one line
    when the file is not a gradleak store or is damaged."""

    def __init__(self, path: str | Path, create: bool = True):
        self.path = Path(path)
        kind = path_kind(self.path, "store")
        if not create and kind is None:
            raise StoreError(f"store '{self.path}' does not exist")
        if kind == "dir":
            raise StoreError(f"store '{self.path}' is a directory, expected a database file")
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = None
        try:
            self._conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._open(create)
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise StoreError(f"store '{self.path}' is corrupted or not a gradleak results database "
                             f"({exc})") from None
        except BaseException:
            self._close_quietly()  # no connection (nor its -wal/-shm files) left behind
            raise

    def _close_quietly(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass

    def _open(self, create: bool) -> None:
        c = self._conn
        app_id = c.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and app_id != APPLICATION_ID:
            raise StoreError(f"store '{self.path}' is an SQLite database but not a gradleak results store")
        if not tables and not create:  # an empty file is not turned into a store by reading it
            raise StoreError(f"store '{self.path}' is empty, not a gradleak results store")
        # quick_check reads every page: damage surfaces here, not halfway through a report.
        verdict = c.execute("PRAGMA quick_check").fetchone()[0]
        if verdict != "ok":
            raise StoreError(f"store '{self.path}' is corrupted ({verdict})")
        if create:  # a reader leaves the file's journal mode as it is
            c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=FULL")
        c.execute("PRAGMA foreign_keys=ON")
        if not tables:
            c.executescript(_SCHEMA)
            c.execute(f"PRAGMA application_id={APPLICATION_ID}")
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        version = c.execute("PRAGMA user_version").fetchone()[0]
        if version == LEGACY_SCHEMA_VERSION and create:
            self._migrate()
            version = SCHEMA_VERSION
        if version not in (SCHEMA_VERSION, LEGACY_SCHEMA_VERSION):
            raise StoreError(f"store '{self.path}' has schema version {version}, "
                             f"this gradleak reads versions {LEGACY_SCHEMA_VERSION} and {SCHEMA_VERSION}")
        self._legacy = version == LEGACY_SCHEMA_VERSION

    def _migrate(self) -> None:
        """Version 1 to 2, once, in one transaction: add the modality column and fill the old
        rows by the legacy rule (the only place a modality is guessed; new rows are declared)."""
        c = self._conn
        assert c is not None  # called on an open store
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute("ALTER TABLE cells ADD COLUMN modality TEXT")
            rows = c.execute("SELECT key, kind, labels, metrics, extras, grid_png FROM cells").fetchall()
            filled = _legacy_fill([(r[0], r[1], _loads(r[2]), _loads(r[3]), _loads(r[4]), r[5], None) for r in rows])
            c.executemany("UPDATE cells SET modality=? WHERE key=?",
                          [(modality, key) for key, modality in filled.items() if modality is not None])
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _guard(self, action):
        try:
            return action()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"store '{self.path}' is corrupted or unreadable ({exc})") from None

    def finished_keys(self) -> set[str]:
        """Keys of cells that need no re-run: a failed cell is tried again."""
        return self._guard(lambda: {r[0] for r in self._conn.execute(
            "SELECT key FROM cells WHERE kind != 'failed'")})

    def add_cell(self, cell: CellRecord, images: list[ImageRecord] = ()) -> bool:
        """Write one finished cell and its images atomically. Returns False (and
        writes nothing) when the cell is already present; a stored failure of the
        same cell is replaced."""
        if cell.modality is not None and cell.modality not in MODALITIES:
            raise StoreError(f"cell {_shown(cell.key)}: unknown modality '{_shown(cell.modality)}'; "
                             f"choose from: {', '.join(MODALITIES)}")
        if self._legacy:  # opened as a reader, written to: migrate first
            self._guard(self._migrate)
            self._legacy = False

        def write():
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                present = c.execute("SELECT kind FROM cells WHERE key=?", (cell.key,)).fetchone()
                if present and present[0] == "failed":
                    c.execute("DELETE FROM cells WHERE key=?", (cell.key,))
                elif present:
                    c.execute("ROLLBACK")
                    return False
                c.execute("INSERT INTO cells (key, kind, sweep, spec, labels, metrics, extras, seconds, "
                          "cpu_seconds, grid_png, finished, modality) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                          (cell.key, cell.kind, cell.sweep, _dump(cell.spec), _dump(cell.labels),
                           _dump(cell.metrics), _dump(cell.extras), cell.seconds, cell.cpu_seconds,
                           cell.grid_png, time.time(), cell.modality))
                c.executemany("INSERT INTO images VALUES (?,?,?,?,?)",
                              [(cell.key, im.idx, _dump(im.metrics), im.original_png, im.reconstruction_png)
                               for im in images])
                c.execute("COMMIT")
                return True
            except BaseException:
                c.execute("ROLLBACK")
                raise
        return self._guard(write)

    def cells(self, kind: str | None = None) -> list[CellRecord]:
        records = self._read_cells(kind)
        if any(r.modality is None for r in records):
            # a version-1 file read as it is, or rows whose writer declared no modality: the
            # migration's legacy rule, in memory
            every = records if not kind else self._read_cells(None)
            filled = _legacy_fill([(c.key, c.kind, c.labels, c.metrics, c.extras, c.grid_png, c.modality)
                                   for c in every])
            for record in records:
                record.modality = filled.get(record.key)
        return records

    def _read_cells(self, kind: str | None) -> list[CellRecord]:
        query = ("SELECT key, kind, sweep, spec, labels, metrics, extras, seconds, grid_png, cpu_seconds, "
                 + ("NULL" if self._legacy else "modality") + " FROM cells")
        args: tuple = ()
        if kind:
            query += " WHERE kind=?"
            args = (kind,)
        rows = self._guard(lambda: self._conn.execute(query + " ORDER BY finished, key", args).fetchall())
        return [self._cell(r) for r in rows]

    def images(self, key: str) -> list[ImageRecord]:
        rows = self._guard(lambda: self._conn.execute(
            "SELECT idx, metrics, original_png, reconstruction_png FROM images WHERE cell_key=? ORDER BY idx",
            (key,)).fetchall())
        where = f"image row of cell {_shown(key)}"
        records = []
        for r in rows:
            if not isinstance(r[0], int) or isinstance(r[0], bool):
                self._malformed(where, "idx", "is not an integer")
            records.append(ImageRecord(r[0], self._numbers(self._json_dict(r[1], where, "metrics"), where, "metrics"),
                                       self._blob(r[2], where, "original_png"),
                                       self._blob(r[3], where, "reconstruction_png")))
        return records

    # Rows are read back as they were written by gradleak; a foreign, hand-edited or damaged
    # row (non-JSON text, a string where a number belongs) is refused with one line naming
    # it, so nothing downstream trips over it.
    def _cell(self, r: tuple) -> CellRecord:
        key = r[0]
        if not isinstance(key, str) or not key:
            self._malformed("a cell", "key", "is not a non-empty text")
        where = f"cell {_shown(key)}"
        for column, value in (("kind", r[1]), ("sweep", r[2])):
            if not isinstance(value, str):
                self._malformed(where, column, "is not text")
        if r[1] not in CELL_KINDS:
            self._malformed(where, "kind", f"is '{_shown(r[1])}', not one of {', '.join(CELL_KINDS)}")
        spec = self._json_dict(r[3], where, "spec")
        labels = self._json_dict(r[4], where, "labels")
        missing = [k for k in REQUIRED_LABELS.get(r[1], ()) if k not in labels]
        if missing:
            self._malformed(where, "labels", f"lacks {', '.join(missing)}")
        for name, value in labels.items():
            items = value if isinstance(value, list) else [value]
            if not all(v is None or isinstance(v, (str, int, float, bool)) for v in items):
                self._malformed(where, "labels", f"holds a nested value under '{_shown(name)}'")
        metrics = self._numbers(self._json_dict(r[5], where, "metrics"), where, "metrics")
        extras = self._json_dict(r[6], where, "extras")
        for column, value in (("seconds", r[7]), ("cpu_seconds", r[9])):
            if column == "cpu_seconds" and value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                self._malformed(where, column, "is not a number")
        if r[10] is not None and r[10] not in MODALITIES:
            self._malformed(where, "modality", f"is '{_shown(r[10])}', not one of {', '.join(MODALITIES)}")
        return CellRecord(key, r[1], r[2], spec, labels, metrics, extras, float(r[7]),
                          self._blob(r[8], where, "grid_png"), r[9], r[10])

    def _malformed(self, where: str, column: str, problem: str):
        raise StoreError(f"store '{self.path}': {where} is malformed: '{column}' {problem} "
                         "(not written by gradleak, or damaged)")

    def _json_dict(self, text: Any, where: str, column: str) -> dict:
        if not isinstance(text, str):
            self._malformed(where, column, "is not JSON text")
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            self._malformed(where, column, "is not valid JSON")
        if not isinstance(value, dict):
            self._malformed(where, column, f"is JSON {type(value).__name__}, not an object")
        return value

    def _numbers(self, values: dict, where: str, column: str) -> dict:
        for name, value in values.items():
            if not (value is None or isinstance(value, (int, float))):
                self._malformed(where, column, f"holds {type(value).__name__} under '{_shown(name)}', "
                                "not a number")
        return values

    def _blob(self, value: Any, where: str, column: str) -> bytes | None:
        if value is not None and not isinstance(value, bytes):
            self._malformed(where, column, "is not binary data")
        return value

    def count(self) -> int:
        return self._guard(lambda: self._conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0])

    def __iter__(self) -> Iterator[CellRecord]:
        return iter(self.cells())


CELL_KINDS = ("attack", "utility", "skipped", "failed")
# What the analysis groups finished cells by (every writer in gradleak stores these).
REQUIRED_LABELS = {"attack": ("attack", "attack_spec", "defense", "strength", "batch_size", "local_steps", "seed"),
                   "utility": ("dataset", "model", "defense", "strength")}


def _shown(value: Any) -> str:
    """A short, printable excerpt of a stored value for a one-line message."""
    text = str(value)
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text[:40] + ("…" if len(text) > 40 else "")


def _loads(text: Any) -> dict:
    """A stored JSON object, or {} where the row is damaged (the legacy fill skips it; reading
    the row later reports the damage)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _legacy_fill(rows: list[tuple]) -> dict[str, str | None]:
    """The legacy path, for rows that record no modality (written before the column, or by a
    writer that declared none): (key, kind, labels, metrics, extras, grid_png, modality) to
    each key's modality. A declared one is kept; an attack row's comes from what it stored
    (`legacy_modality`); any other row (utility, skipped, failed) takes the one of the attack
    rows on its dataset, where they agree; else None."""
    found: dict[str, str | None] = {}
    by_dataset: dict[str, set] = {}
    for key, kind, labels, metrics, extras, grid, declared in rows:
        if declared is not None:
            found[key] = declared
        elif kind == "attack":
            found[key] = legacy_modality(metrics, isinstance(extras.get("sequences"), list), grid is not None)
        if kind == "attack" and found.get(key) is not None:
            by_dataset.setdefault(str(labels.get("dataset")), set()).add(found[key])
    for key, kind, labels, _, _, _, declared in rows:
        if kind != "attack" and declared is None:
            known = by_dataset.get(str(labels.get("dataset")), set())
            found[key] = next(iter(known)) if len(known) == 1 else None
    return found


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_json_default, allow_nan=True)


def _json_default(value: Any):
    try:
        import torch
        if isinstance(value, torch.Tensor):
            return value.tolist()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
