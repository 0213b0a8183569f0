"""Views of a store beyond the verdict: Wei et al.-style studies (ASR and iterations as one
factor varies), a federation's leakage per round, and the report's defense × attack matrices."""
from __future__ import annotations

from collections import defaultdict

from ..modalities import stored_modality
from ..store import CellRecord
from .cells import average, sortable
from .rows import attack_rows
from .verdict import ATTACK_METRICS


def study_tables(cells: list[CellRecord]) -> dict[str, list[dict]]:
    """Wei et al.-style studies: ASR and iterations per attack as one factor varies
    (the others averaged): initialisation, batch size, local iterations, compression."""
    rows = attack_rows(cells)
    factors = {
        "initialisation": lambda r: r.get("init") or "default",
        "batch size": lambda r: r["batch_size"],
        "local iterations": lambda r: r["local_steps"],
        "compression": _compression,
    }
    tables = {}
    for title, factor in factors.items():
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for r in rows:
            value = factor(r)
            if value is not None:
                # rows of different threat models, datasets or models are never averaged together
                groups[(r["threat"], r["dataset"], r["model"], r["attack"], value)].append(r)
        values = {k[-1] for k in groups}
        if len(values) < 2:  # nothing varied along this factor in this store
            continue
        table = [{"threat": threat, "dataset": dataset, "model": model, "attack": attack, title: value,
                  "asr": average([m.get("asr") for m in members]),
                  "iterations": average([m.get("iterations") for m in members]),
                  "psnr": average([m.get("psnr") for m in members]), "cells": len(members)}
                 for (threat, dataset, model, attack, value), members in groups.items()]
        table.sort(key=lambda t: (str(t["threat"]), str(t["dataset"]), str(t["model"]), t["attack"],
                                  sortable(t[title])))
        tables[title] = table
    return tables


_COMPRESSION_DEFENSES = {"prune", "topk", "dgc", "dropout"}


def _compression(row: dict) -> str | None:
    """Compression level for sparsifying defenses ('none' for the undefended run)."""
    if row["defense"] == "none":
        return "none"
    if row["defense"] in _COMPRESSION_DEFENSES:
        return f"{row['defense']} {row['strength']}"
    return None


def leakage_by_round(cells: list[CellRecord]) -> list[dict]:
    """Rows of a federation's audit (cells labelled with a round): one per round ×
    client × attack, sorted by round, client and attack."""
    rows = []
    for c in cells:
        if c.kind != "attack" or "round" not in c.labels:
            continue
        lab = c.labels
        rows.append({"round": lab["round"], "client": lab.get("client"), "attack": lab.get("attack_spec"),
                     "defense": lab.get("defense"), **{k: c.metrics.get(k) for k in ATTACK_METRICS},
                     "key": c.key})
    rows.sort(key=lambda r: (sortable(r["round"]), sortable(r["client"]), str(r["attack"])))
    return rows


MATRIX_KEYS = ("threat", "dataset", "model")  # one matrix each
MATRIX_ROW_KEYS = ("batch_size", "local_steps", "defense", "strength")


def _cell_threat(cell: CellRecord):
    # skipped rows name the threat model only in their spec
    threat = cell.labels.get("threat")
    if threat is None and isinstance(cell.spec, dict):
        threat = cell.spec.get("threat")
    return threat if threat is not None else "unrecorded"


def _better(a: CellRecord, b: CellRecord) -> bool:
    """Is a's reconstruction better than b's, by their data's rule (`Modality.best_by`:
    lower MSE, then higher PSNR for pictures; higher ROUGE-1 for token sequences)."""
    return stored_modality(a.modality).rank(a.metrics) < stored_modality(b.modality).rank(b.metrics)


def best_reconstructions(cells: list[CellRecord]) -> list[dict]:
    """The defense × attack matrices of the report: one per (threat model, dataset, model);
    rows are defense settings (with batch size and local steps, never mixed), columns attacks.
    A cell holds the best-reconstructing attack cell over seeds (lowest MSE; for token
    sequences, highest ROUGE-1), or why there is
    none: the attack was not run (with the reason) or failed (with the error)."""
    groups: dict[tuple, dict] = {}
    for c in cells:
        kind = c.kind if c.kind != "failed" else ("failed" if c.labels.get("cell_kind") == "attack" else None)
        if kind not in ("attack", "skipped", "failed") or not c.labels.get("attack_spec"):
            continue
        lab = c.labels
        key = (_cell_threat(c), lab.get("dataset"), lab.get("model"))
        group = groups.setdefault(key, {"rows": {}, "columns": {}, "cells": {}})
        row = tuple(lab.get(k) if k != "strength" else lab.get(k) or "" for k in MATRIX_ROW_KEYS)
        if row[2] is None:
            row = (row[0], row[1], "none", "")
        column = str(lab["attack_spec"])
        group["rows"][row] = None
        group["columns"][column] = None
        slot = group["cells"].setdefault((row, column), {"best": None, "seeds": 0, "failed": [], "not_run": None})
        if kind == "attack":
            slot["seeds"] += 1
            if slot["best"] is None or _better(c, slot["best"]):
                slot["best"] = c
        elif kind == "failed":
            error = c.extras.get("error") if isinstance(c.extras, dict) else None
            slot["failed"].append(str(error or "no error recorded"))
        else:
            slot["not_run"] = str(lab.get("reason") or (c.extras or {}).get("reason") or "not applicable")
    out = []
    order = ["honest", "informed", "malicious"]
    for key, group in sorted(groups.items(), key=lambda kv: (
            order.index(str(kv[0][0]).split("+")[0]) if str(kv[0][0]).split("+")[0] in order else len(order),
            *[str(v) for v in kv[0]])):
        rows = sorted(group["rows"], key=lambda r: (sortable(r[0]), sortable(r[1]), r[2] != "none", str(r[2]),
                                                    str(r[3])))
        out.append({**dict(zip(MATRIX_KEYS, key)), "rows": rows, "columns": sorted(group["columns"]),
                    "cells": group["cells"]})
    return out
