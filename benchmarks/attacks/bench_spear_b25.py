"""SPEAR at its stated limit: adult through the 2×256 ReLU mlp at B = 25, one batch per seed,
seeds run side by side in worker processes (one thread each), each climbing the draw ladder
(65,536 draws, doubling `doublings` times) until its batch verifies. Prints per seed whether
the whole batch came back exact (MSE ≤ 1e-6 after standardisation), the draws and seconds.

python -m benchmarks spear_b25 [--quick] [--workers N]
  seeds 8 (--quick: 2), doublings 4 (--quick: 3); GRADLEAK_SPEAR_SEEDS / _DOUBLINGS override
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

BATCH = 25


def _seed(args: tuple[int, int]) -> dict:
    import torch

    from benchmarks.attacks.common import spear_batch
    from gradleak.data import DatasetSpec, load_dataset
    from gradleak.models import ModelSpec

    torch.set_num_threads(1)
    seed, doublings = args
    adult = load_dataset(DatasetSpec("adult", split="test"))
    spec = ModelSpec("mlp", tuple(adult.inputs.shape[1:]), 2, seed=seed)
    result = spear_batch(adult, spec, BATCH, seed, doublings, None)
    return {"seed": seed, **result, "seconds": round(result["seconds"], 1)}


def run(quick: bool = False, workers: int | None = None) -> dict:
    seeds = int(os.environ.get("GRADLEAK_SPEAR_SEEDS", 2 if quick else 8))
    doublings = int(os.environ.get("GRADLEAK_SPEAR_DOUBLINGS", 3 if quick else 4))
    with ProcessPoolExecutor(max_workers=workers or min(seeds, os.cpu_count() or 1)) as pool:
        runs = list(pool.map(_seed, [(s, doublings) for s in range(seeds)]))
    seconds = sorted(r["seconds"] for r in runs)
    return {"batch": BATCH, "seeds": seeds, "doublings": doublings,
            "whole_batches": sum(r["exact"] == BATCH for r in runs),
            "exact_fraction": round(sum(r["exact"] for r in runs) / (BATCH * seeds), 4),
            "seconds_median": seconds[seeds // 2], "seconds_max": seconds[-1], "runs": runs}



def run_with(argv: list[str]) -> dict:
    from benchmarks.common import run_with_workers

    return run_with_workers(run, "spear_b25", argv)
