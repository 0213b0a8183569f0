"""The demo's compression settings attacked harder, on fresh examples, as a new user would run
them: a sweep of MNIST and the demo's sigmoid LeNet on seeds the demo never uses ({41, 42}),
the demo's honest attacks at four times its budgets (IG 800 iterations, CPL 80, ROG 400, and
ROG's sign attack for signSGD), each climbing the same budget ladder (3 doublings), graded by
the verdict's rules at the default tolerance, with the sample ladder adding fresh examples
(up to 64 per attack) wherever a verdict is still open. Settings: pruning 0.9 and 0.99, top-k
0.95 and signSGD at batch 4 (the demo's); with GRADLEAK_FRESH_BATCH1=1 also pruning 0.99 at
batch 1, which the demo does not run (64 single-example attacks per attack: about 1,500 CPU
seconds more); GRADLEAK_FRESH_BATCH1=only runs that setting alone.

Printed per setting: grade, the grading attack, linkage AUC and recognizable rate with 95%
intervals, examples per attack, sample rungs added, and each attack's best SSIM (the
noise-like signSGD reconstructions must not be called recognizable). The demo's own grades
for the same settings are in docs/verdicts.md; compare there.

python -m benchmarks fresh_settings [--quick] [--workers N]
  --quick: batch 4 only, budgets of the demo, samples up to 36 (a smoke run)
Resumes: GRADLEAK_BENCH_DIR keeps the store; a rerun skips finished cells.
GRADLEAK_FRESH_MAX_EXAMPLES and GRADLEAK_FRESH_RUNGS raise the sample ladder's cap and rungs
(64 and 3 by default): a rerun on the kept store goes on only where a verdict is still open.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

SEEDS = (41, 42)


def sweep_text(quick: bool = False) -> str:
    ig, cpl, rog = (200, 20, 100) if quick else (800, 80, 400)
    with_batch_one = not quick and os.environ.get("GRADLEAK_FRESH_BATCH1") in ("1", "only")
    only_batch_one = with_batch_one and os.environ.get("GRADLEAK_FRESH_BATCH1") == "only"
    max_examples = 36 if quick else int(os.environ.get("GRADLEAK_FRESH_MAX_EXAMPLES") or 64)
    rungs = 3 if quick else int(os.environ.get("GRADLEAK_FRESH_RUNGS") or 3)
    batch_one = "" if not with_batch_one else f"""
  - datasets: [mnist]
    models: [lenet]
    batch_sizes: [1]
    local_steps: [1]
    seeds: [{SEEDS[0]}, {SEEDS[1]}]
    defenses: [prune:ratio=0.99]
    attacks: [ig:iterations={ig}, cpl:iterations={cpl}, rog:iterations={rog}]
"""
    head = f"""name: fresh-settings
defaults:
  lpips: alex
  lr: 0.1
  device: cpu
tolerance: {{linkage: 0.6, recognizable: 0.1}}
samples: {{rungs: {rungs}, max_examples: {max_examples}}}
grids:"""
    if only_batch_one:
        return head + batch_one
    return head + f"""
  - datasets: [mnist]
    models: [lenet]
    batch_sizes: [4]
    local_steps: [1]
    seeds: [{SEEDS[0]}, {SEEDS[1]}]
    defenses:
      - {{name: prune, options: {{ratio: [0.9, 0.99]}}}}
      - topk:sparsity=0.95
      - sign
    attacks: [ig:iterations={ig}, cpl:iterations={cpl}, rog:iterations={rog}]
  - datasets: [mnist]
    models: [lenet]
    batch_sizes: [4]
    local_steps: [1]
    seeds: [{SEEDS[0]}, {SEEDS[1]}]
    defenses: [sign]
    attacks: [rog-sign]
{batch_one}"""


def _best_ssim(store, cells, entry) -> float | None:
    """The highest SSIM any attack reached on any example of the setting."""
    best = None
    for cell in cells:
        labels = cell.labels
        if (cell.kind == "attack" and labels.get("defense") == entry["defense"]
                and labels.get("strength") == entry["strength"] and labels.get("threat") == "honest"
                and labels.get("batch_size") == entry["batch_size"]):
            for image in store.images(cell.key):
                ssim = image.metrics.get("ssim")
                if ssim is not None:
                    best = ssim if best is None else max(best, ssim)
    return None if best is None else round(best, 3)


def run(quick: bool = False, workers: int | None = None) -> dict:
    from benchmarks.pipeline.common import sample_examples, seed_row
    from gradleak.analysis import strongest_attacks
    from gradleak.store import ResultStore
    from gradleak.sweep import parse_sweep, run_sweep

    root = Path(os.environ.get("GRADLEAK_BENCH_DIR") or tempfile.mkdtemp(prefix="fresh-settings-"))
    root.mkdir(parents=True, exist_ok=True)
    sweep = parse_sweep(sweep_text(quick), "fresh-settings")
    start = time.perf_counter()
    with ResultStore(root / ("fresh-quick.db" if quick else "fresh.db")) as store:
        summary = run_sweep(sweep, store, workers=workers, show_progress=False)
        cells = store.cells()
        entries = [e for e in strongest_attacks(cells) if e["threat"] == "honest"]
        rows = []
        for entry in entries:
            row = seed_row(entry)
            row["best_ssim"] = _best_ssim(store, cells, entry)
            row["sample_examples"] = sample_examples(cells, entry)
            rows.append(row)
    return {"seconds": round(time.perf_counter() - start, 1), "cells": summary["cells"],
            "sample_cells": summary["sample_cells"], "workers": workers, "settings": rows,
            "recognizable_sign": [r["recognizable"] for r in rows if "sign" in r["setting"]]}



def run_with(argv: list[str]) -> dict:
    from benchmarks.common import run_with_workers

    return run_with_workers(run, "fresh_settings", argv)
