"""Each store row records the modality of its data; stores from before that column still open."""
from __future__ import annotations

import json
import sqlite3

import pytest

from gradleak.errors import GradleakError
from gradleak.store import APPLICATION_ID, SCHEMA_VERSION, CellRecord, ResultStore

# schema version 1, as gradleak wrote it before the modality column
V1_SCHEMA = """
CREATE TABLE cells (key TEXT PRIMARY KEY, kind TEXT NOT NULL, sweep TEXT NOT NULL, spec TEXT NOT NULL,
    labels TEXT NOT NULL, metrics TEXT NOT NULL, extras TEXT NOT NULL, seconds REAL NOT NULL, cpu_seconds REAL,
    grid_png BLOB, finished REAL NOT NULL);
CREATE TABLE images (cell_key TEXT NOT NULL REFERENCES cells(key) ON DELETE CASCADE, idx INTEGER NOT NULL,
    metrics TEXT NOT NULL, original_png BLOB, reconstruction_png BLOB, PRIMARY KEY (cell_key, idx));
"""


def _labels(dataset: str, **extra) -> dict:
    return {"attack": "ig", "attack_spec": "ig", "defense": "none", "strength": "", "batch_size": 1,
            "local_steps": 1, "seed": 0, "dataset": dataset, "model": "m", **extra}


def _v1_store(path) -> None:
    rows = [("picture", "attack", _labels("mnist"), {"mse": 0.1, "psnr": 10.0}, {}, b"png"),
            ("sentence", "attack", _labels("news"), {"rouge1": 0.5}, {"sequences": []}, None),
            ("record", "attack", _labels("adult"), {"mse": 0.2}, {}, None),
            ("nothing", "attack", _labels("other"), {}, {}, None),
            ("utility", "utility", {"dataset": "adult", "model": "m", "defense": "none", "strength": ""},
             {"test_accuracy": 0.8}, {}, None),
            ("failed", "failed", _labels("elsewhere"), {}, {"error": "boom"}, None)]
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute("PRAGMA user_version=1")
    conn.executemany("INSERT INTO cells VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                     [(key, kind, "s", "{}", json.dumps(labels), json.dumps(metrics), json.dumps(extras), 1.0, None,
                       grid, float(i)) for i, (key, kind, labels, metrics, extras, grid) in enumerate(rows)])
    conn.commit()
    conn.close()


LEGACY = {"picture": "image", "sentence": "text", "record": "tabular", "nothing": None, "utility": "tabular",
          "failed": None}


def test_a_row_keeps_the_modality_its_writer_declared(tmp_path):
    with ResultStore(tmp_path / "s.db") as store:
        # an MSE alone would have read as tabular: the declared modality wins
        store.add_cell(CellRecord("k", "attack", "s", {}, _labels("mine"), {"mse": 0.1}, {}, 1.0, modality="image"))
        store.add_cell(CellRecord("f", "failed", "s", {}, _labels("mine"), {}, {}, 0.0))
    with ResultStore(tmp_path / "s.db", create=False) as store:
        # the failed row declared none: it takes its dataset's, from the attack row
        assert {c.key: c.modality for c in store.cells()} == {"k": "image", "f": "image"}
        assert [c.modality for c in store.cells("attack")] == ["image"]
    conn = sqlite3.connect(tmp_path / "s.db")
    assert dict(conn.execute("SELECT key, modality FROM cells").fetchall()) == {"k": "image", "f": None}
    conn.close()


def test_an_unknown_modality_is_refused_on_write(tmp_path):
    with ResultStore(tmp_path / "s.db") as store, pytest.raises(GradleakError, match="unknown modality 'pixels'"):
        store.add_cell(CellRecord("k", "attack", "s", {}, _labels("d"), {}, {}, 1.0, modality="pixels"))


def test_a_reader_reads_an_old_store_as_it_is(tmp_path):
    path = tmp_path / "old.db"
    _v1_store(path)
    before = path.read_bytes()
    with ResultStore(path, create=False) as store:
        assert {c.key: c.modality for c in store.cells()} == LEGACY
        # a filtered read fills the utility row from the attack rows on its dataset all the same
        assert [c.modality for c in store.cells("utility")] == ["tabular"]
    assert path.read_bytes() == before


def test_a_writer_migrates_an_old_store_once(tmp_path):
    path = tmp_path / "old.db"
    _v1_store(path)
    with ResultStore(path) as store:
        assert {c.key: c.modality for c in store.cells()} == LEGACY
        store.add_cell(CellRecord("new", "attack", "s", {}, _labels("news"), {}, {}, 1.0, modality="text"))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    stored = dict(conn.execute("SELECT key, modality FROM cells").fetchall())
    conn.close()
    assert stored == {**LEGACY, "new": "text"}


def test_writing_to_an_old_store_opened_for_reading_migrates_it_first(tmp_path):
    path = tmp_path / "old.db"
    _v1_store(path)
    with ResultStore(path, create=False) as store:
        store.add_cell(CellRecord("new", "attack", "s", {}, _labels("d"), {}, {}, 1.0, modality="tabular"))
        assert {c.key: c.modality for c in store.cells()} == {**LEGACY, "new": "tabular"}


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.db"
    ResultStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(GradleakError, match=f"schema version {SCHEMA_VERSION + 1}"):
        ResultStore(path, create=False)
