"""Sweep throughput: cells per minute with 1 vs 2 local workers on the demo sweep.

Target: 2 workers ≥ 1.8× the cells per minute of 1 worker. Both runs
include worker start-up. On a shared machine the ratio is bounded by the cores
actually free: the load average before and after is reported with the numbers.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path


def _cells(quick: bool):
    from gradleak.commands.demo import demo_spec_text
    from gradleak.sweep import parse_sweep

    sweep = parse_sweep(demo_spec_text(), "demo.yaml")
    cells = sweep.attack_cells
    if quick:  # batch size 1, FedSGD: a 2×-divisible slice of every attack and defense
        cells = [c for c in cells if c.labels["batch_size"] == 1 and c.labels["local_steps"] == 1][:16]
    sweep.cells = cells
    return sweep


def _throughput(sweep, workers: int) -> dict:
    from gradleak.store import ResultStore
    from gradleak.sweep import run_sweep

    with tempfile.TemporaryDirectory() as tmp:
        with ResultStore(Path(tmp) / "bench.db") as store:
            start = time.perf_counter()
            summary = run_sweep(sweep, store, workers=workers, show_progress=False)
            seconds = time.perf_counter() - start
    # cores_obtained = the cells' CPU time / wall time: on an idle machine ≈ workers;
    # on a shared one it shows how much of the machine the run actually got.
    return {"cells": summary["ran"], "seconds": round(seconds, 2),
            "cells_per_minute": round(60 * summary["ran"] / seconds, 2),
            "cell_cpu_seconds": round(summary["cpu_seconds"], 2),
            "cores_obtained": round(summary["cpu_seconds"] / seconds, 2)}


def run(quick: bool) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sweep = _cells(quick)
    load_before = os.getloadavg()[0]
    one = _throughput(sweep, 1)
    two = _throughput(sweep, 2)
    load_after = os.getloadavg()[0]
    speedup = two["cells_per_minute"] / one["cells_per_minute"]
    return {"cells": len(sweep.cells), "one_worker": one, "two_workers": two, "speedup": round(speedup, 2),
            "target_speedup": 1.8, "meets_target": speedup >= 1.8, "cores": os.cpu_count(),
            "load_average_before": round(load_before, 2), "load_average_after": round(load_after, 2),
            "contended": max(load_before, load_after) > 1.5}
