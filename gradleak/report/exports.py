"""The report's CSV and JSON exports: the strongest attacks, every attack and utility cell."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from ..store import ResultStore


def _write_csv(path: Path, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})


def write_exports(out: Path, cells, entries, rows, store: ResultStore) -> None:
    _write_csv(out / "strongest.csv", entries)
    _write_csv(out / "attacks.csv", [{k: v for k, v in r.items() if k != "keys"} for r in rows])
    _write_csv(out / "utility.csv", [{**c.labels, **c.metrics, "seconds": c.seconds, "key": c.key}
                                     for c in cells if c.kind == "utility"])
    payload = {"strongest": entries,
               "cells": [{"key": c.key, "kind": c.kind, "sweep": c.sweep, "spec": c.spec, "labels": c.labels,
                          "metrics": c.metrics, "seconds": c.seconds,
                          "per_example": [im.metrics for im in store.images(c.key)]} for c in cells]}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))

