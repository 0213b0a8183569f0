"""A store is data, not markup: whatever its keys and labels hold, the report
escapes it and writes only inside its own folder."""
from __future__ import annotations

import io
import re

from PIL import Image

from gradleak.report import write_report
from gradleak.store import CellRecord, ResultStore


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("L", (4, 4)).save(buf, format="PNG")
    return buf.getvalue()


def test_hostile_keys_and_labels_are_escaped(tmp_path):
    store_path = tmp_path / "store.db"
    hostile = "'onload='alert(1)"
    labels = {"dataset": "<script>alert(2)</script>", "model": hostile, "batch_size": 1, "local_steps": 1,
              "seed": 0, "defense": "<b>x</b>", "strength": hostile, "defenses": [], "attack": "ig",
              "attack_spec": f"ig:{hostile}", "init": None}
    with ResultStore(store_path) as store:
        for key in ("../../escaped", hostile):
            store.add_cell(CellRecord(key, "attack", "s", {}, labels, {"mse": 0.1, "psnr": 10.0}, {}, 1.0,
                                      _png()))
    out = tmp_path / "report"
    write_report(store_path, out)
    page = (out / "index.html").read_text()
    assert "<script>alert(2)" not in page and "<b>x</b>" not in page
    assert not re.search(r"<[^>]*\sonload=", page)
    assert not (tmp_path / "escaped.png").exists() and not list(tmp_path.glob("*.png"))
    assert len(list((out / "images").glob("*.png"))) == 2
    # every picture, the matrix's thumbnails included, is a hashed file of the report or a plot
    sources = re.findall(r"src='([^']*)'", page)
    assert "id='matrix'" in page and sources
    assert all(re.fullmatch(r"images/[0-9a-f]{32}\.png|tradeoff-\d+\.png|rounds\.png", s) for s in sources)


def test_large_batch_thumbnail_is_a_hashed_file(tmp_path):
    """A batch wider than the matrix shows gets its own thumbnail file, named like the grids."""
    from gradleak.store import ImageRecord

    hostile = "../<img src=x onerror=alert(1)>"
    labels = {"threat": "honest", "dataset": "mnist", "model": "lenet", "batch_size": 16, "local_steps": 1,
              "seed": 0, "defense": "none", "strength": "", "defenses": [], "attack": "ig", "attack_spec": hostile,
              "init": None}
    with ResultStore(tmp_path / "store.db") as store:
        store.add_cell(CellRecord(hostile, "attack", "s", {}, labels, {"mse": 0.1, "psnr": 10.0}, {}, 1.0, _png()),
                       [ImageRecord(i, {"mse": 0.1}, _png(), _png()) for i in range(16)])
    write_report(tmp_path / "store.db", tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<img src=x" not in page
    thumbs = re.findall(r"<img class='thumb' src='(images/[0-9a-f]{32}\.png)'", page)
    assert len(thumbs) == 1 and (tmp_path / "report" / thumbs[0]).exists()
    assert len(list((tmp_path / "report" / "images").glob("*.png"))) == 2  # the grid and its thumbnail
    assert not list(tmp_path.glob("*.png"))
