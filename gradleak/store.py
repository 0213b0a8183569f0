"""The durable results store: one SQLite file (WAL), one row per sweep cell.

A cell is keyed by the hash of its full spec, so re-running a sweep finds the
cells it already has and skips them. Each cell (its metrics, per-image scores
and PNG images) is written in one transaction: a process killed at any moment
leaves either the whole cell or nothing of it.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .errors import GradleakError

# "GLK1": lets us tell our file from any other SQLite database.
APPLICATION_ID = 0x474C4B31
SCHEMA_VERSION = 1

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
    finished REAL NOT NULL
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
        if not create and not self.path.exists():
            raise GradleakError(f"store '{self.path}' does not exist")
        if self.path.is_dir():
            raise GradleakError(f"store '{self.path}' is a directory, expected a database file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._open()
        except sqlite3.DatabaseError as exc:
            raise GradleakError(f"store '{self.path}' is corrupted or not a gradleak results database "
                                f"({exc})") from None

    def _open(self) -> None:
        c = self._conn
        app_id = c.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and app_id != APPLICATION_ID:
            raise GradleakError(f"store '{self.path}' is an SQLite database but not a gradleak results store")
        # quick_check reads every page: damage surfaces here, not halfway through a report.
        verdict = c.execute("PRAGMA quick_check").fetchone()[0]
        if verdict != "ok":
            raise GradleakError(f"store '{self.path}' is corrupted ({verdict})")
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=FULL")
        c.execute("PRAGMA foreign_keys=ON")
        if not tables:
            c.executescript(_SCHEMA)
            c.execute(f"PRAGMA application_id={APPLICATION_ID}")
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        version = c.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise GradleakError(f"store '{self.path}' has schema version {version}, "
                                f"this gradleak reads version {SCHEMA_VERSION}")

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
            raise GradleakError(f"store '{self.path}' is corrupted or unreadable ({exc})") from None

    def finished_keys(self) -> set[str]:
        """Keys of cells that need no re-run: a failed cell is tried again."""
        return self._guard(lambda: {r[0] for r in self._conn.execute(
            "SELECT key FROM cells WHERE kind != 'failed'")})

    def add_cell(self, cell: CellRecord, images: list[ImageRecord] = ()) -> bool:
        """Write one finished cell and its images atomically. Returns False (and
        writes nothing) when the cell is already present; a stored failure of the
        same cell is replaced."""
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
                c.execute("INSERT INTO cells VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                          (cell.key, cell.kind, cell.sweep, _dump(cell.spec), _dump(cell.labels),
                           _dump(cell.metrics), _dump(cell.extras), cell.seconds, cell.cpu_seconds,
                           cell.grid_png, time.time()))
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
        query = ("SELECT key, kind, sweep, spec, labels, metrics, extras, seconds, grid_png, cpu_seconds "
                 "FROM cells")
        args: tuple = ()
        if kind:
            query += " WHERE kind=?"
            args = (kind,)
        rows = self._guard(lambda: self._conn.execute(query + " ORDER BY finished, key", args).fetchall())
        return [CellRecord(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[4]), json.loads(r[5]),
                           json.loads(r[6]), r[7], r[8], r[9]) for r in rows]

    def images(self, key: str) -> list[ImageRecord]:
        rows = self._guard(lambda: self._conn.execute(
            "SELECT idx, metrics, original_png, reconstruction_png FROM images WHERE cell_key=? ORDER BY idx",
            (key,)).fetchall())
        return [ImageRecord(r[0], json.loads(r[1]), r[2], r[3]) for r in rows]

    def count(self) -> int:
        return self._guard(lambda: self._conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0])

    def __iter__(self) -> Iterator[CellRecord]:
        return iter(self.cells())


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
