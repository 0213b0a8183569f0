"""Liu et al.'s feature-prior attack vs Inverting Gradients on LPIPS.

cifar10 samples, batch 16, ResNet-20 (ResNet-18's double backward at batch 16
is too slow on the shared 2-core CPU), equal iteration budgets. Feature-prior
runs under the malicious threat model (it inserts the wide random probe layer),
IG on the unmodified model under the honest one; both are given the labels and
feature-prior also the BN statistics (Liu et al.'s "BN_exact" setting).
Times are wall-clock and inflated by CPU contention.
"""
from __future__ import annotations

import time

from gradleak.run.experiment import AttackRunSpec, run_attack


def _run(attack: str, threat: str, iterations: int, batch: int) -> dict:
    start = time.perf_counter()
    result = run_attack(AttackRunSpec(dataset="cifar10", model="resnet20", batch_size=batch,
                                      attack=f"{attack}:iterations={iterations}", threat=threat,
                                      knows=("labels", "bn_statistics"), seed=0))
    m = result.metrics
    return {"lpips": round(m["lpips"], 4), "psnr": round(m["psnr"], 3), "mse": round(m["mse"], 4),
            "seconds": round(time.perf_counter() - start, 1)}


def run(quick: bool) -> dict:
    iterations = 100 if quick else 500
    batch = 16
    feature_prior = _run("feature-prior", "malicious", iterations, batch)
    ig = _run("ig", "honest", iterations, batch)
    return {
        "dataset": "cifar10", "model": "resnet20", "batch_size": batch, "iterations": iterations,
        "feature_prior": feature_prior, "ig": ig,
        "feature_prior_beats_ig_lpips": feature_prior["lpips"] < ig["lpips"],
        "note": "times inflated by CPU contention",
    }
