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
