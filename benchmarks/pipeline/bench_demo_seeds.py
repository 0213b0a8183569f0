"""The demo's verdicts on other seeds: the embedded demo sweep run unchanged but for its seeds
({0, 1}, {2, 3}, {4, 5}), each into its own store, then compared. Printed per seed set: wall
seconds, the sample cells added, every setting's verdict and grade with its evidence (linkage
AUC and recognizable rate with 95% intervals, examples), and the answer per scenario; then
whether any setting holds in one seed set and carries a grade in another, and whether the
answers name the same defense. `--quick` runs the demo's seeds only.

python -m benchmarks demo_seeds [--quick]      (about 5 minutes per seed set on 2 cores)
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

SEED_SETS = ([0, 1], [2, 3], [4, 5])


def run(quick: bool = False) -> dict:
    from benchmarks.pipeline.common import sample_examples, seed_row
    from gradleak.analysis import answer, strongest_attacks
    from gradleak.commands.demo import demo_spec_text
    from gradleak.store import ResultStore
    from gradleak.sweep import parse_sweep, run_sweep

    root = Path(os.environ.get("GRADLEAK_BENCH_DIR") or tempfile.mkdtemp(prefix="demo-seeds-"))
    results = {}
    for seeds in SEED_SETS[:1] if quick else SEED_SETS:
        text = demo_spec_text().replace("seeds: [0, 1]\n", f"seeds: [{seeds[0]}, {seeds[1]}]\n")
        sweep = parse_sweep(text, f"demo-seeds-{seeds[0]}-{seeds[1]}")
        start = time.perf_counter()
        with ResultStore(root / f"seeds-{seeds[0]}-{seeds[1]}.db") as store:
            summary = run_sweep(sweep, store, show_progress=False)
            cells = store.cells()
            entries = strongest_attacks(cells)
        results[str(seeds)] = {"seconds": round(time.perf_counter() - start, 1), "cells": summary["cells"],
                               "sample_cells": summary["sample_cells"],
                               "settings": [{**seed_row(e), "sample_examples": sample_examples(cells, e)}
                                            for e in entries],
                               "answers": {f"{a['threat']} b{a['batch_size']}": a["text"] for a in answer(entries)},
                               "answer_settings": {f"{a['threat']} b{a['batch_size']}":
                                                   f"{a['setting']['defense']} {a['setting']['strength']}".strip()
                                                   for a in answer(entries)}}
    grades: dict[str, set] = {}
    for result in results.values():
        for row in result["settings"]:
            grades.setdefault(row["setting"], set()).add(row["grade"])
    # holds in one seed set, a leak grade in another (copies, recognizable, or linkable: linkage
    # shown beyond the tolerance): the answer contradicted. "Not shown" beside "holds" is no
    # contradiction: its examples could not yet place a rate on either side of the tolerance
    flips = {s: sorted(map(str, g)) for s, g in grades.items()
             if "holds" in g and g & {"copies", "recognizable", "linkable"}}
    not_shown = {s: sorted(map(str, g)) for s, g in grades.items() if "holds" in g and None in g}
    answers = {k: {r["answer_settings"][k] for r in results.values()} for k in next(iter(results.values()))["answers"]}
    return {"store_dir": str(root), "seed_sets": results, "holds_vs_leak_flips": flips,
            "holds_vs_not_shown": not_shown,
            "same_answer_everywhere": all(len(v) == 1 for v in answers.values()),
            "answer_defenses": {k: sorted(v) for k, v in answers.items()}}
