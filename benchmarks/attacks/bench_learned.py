"""The learned inverter (Wu et al., Learning to Invert) against each defense, beside today's
gradient-matching attacks and Inverting Gradients started from the inverter's output.

Each row is one (dataset, model, batch, defense) client (FedSGD, lr 0.1, seed 0, labels
recovered from the update, honest server: the inverter learns on public photo crops,
`gradleak.data.auxiliary`, never on the reported data). Columns, all through `run_attack`
with one artifacts folder, so `ig:init=learned` reuses the inverter the `learned` row
trained:
- `learned`: PSNR / SSIM / re-identification, its training and data seconds, inference ms;
- `best`: the best PSNR of `ig` (1,000 iterations), `cpl` and `rog` (their defaults; `rog-sign`
  too under signSGD), with its attack;
- `ig_from_learned`: IG for 1,000 iterations from the inverter's output.
Each row is printed to stderr as it finishes. The quick run is MNIST LeNet at batch 1 under
no defense, signSGD and top-k 0.95; the full run every defense at batch 1 and 4 on MNIST
LeNet, and the compression defenses at batch 1 on cifar10 ConvNet-64 (minutes per inverter on
2 cores: 1,000 client updates of a 2.9M-parameter model).
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from gradleak.run.experiment import AttackRunSpec, run_attack

DEFENSES = ("none", "noise:sigma=0.01", "noise:sigma=0.1", "sign", "prune:ratio=0.9", "prune:ratio=0.99",
            "topk:sparsity=0.95", "quantize:bits=3")
COMPRESSION = ("sign", "prune:ratio=0.99", "topk:sparsity=0.95")


def _scores(result) -> dict:
    m = result.metrics
    return {"psnr": round(m["psnr"], 2), "ssim": round(m["ssim"], 3), "reid": m.get("reid"), "copied": m.get("asr")}


def _row(dataset: str, model: str, batch: int, defense: str, artifacts: Path, bn_mode: str = "train") -> dict:
    base = dict(dataset=dataset, model=model, batch_size=batch, defenses=() if defense == "none" else (defense,),
                seed=0, lpips="none", bn_mode=bn_mode)
    row: dict = {"dataset": dataset, "model": model, "batch": batch, "defense": defense}
    start = time.perf_counter()
    learned = run_attack(AttackRunSpec(attack="learned", **base), artifacts=artifacts)
    inverter = learned.extras["inverter"][0]
    row["learned"] = {**_scores(learned), "train_seconds": inverter["train_seconds"],
                      "data_seconds": inverter["data_seconds"], "inference_ms": inverter["inference_ms"],
                      "epochs": inverter["epochs"], "seconds": round(time.perf_counter() - start, 1)}
    attacks = ["ig:iterations=1000", "cpl", "rog"] + (["rog-sign"] if defense == "sign" else [])
    best = None
    for attack in attacks:
        scores = _scores(run_attack(AttackRunSpec(attack=attack, **base), artifacts=artifacts))
        if best is None or scores["psnr"] > best["psnr"]:
            best = {**scores, "attack": attack}
    row["best"] = best
    row["ig_from_learned"] = _scores(run_attack(AttackRunSpec(attack="ig:iterations=1000,init=learned", **base),
                                                artifacts=artifacts))
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def run(quick: bool) -> dict:
    torch.set_num_threads(1)
    artifacts = Path(tempfile.mkdtemp(prefix="gradleak-bench-learned-"))
    if quick:
        rows = [_row("mnist", "lenet", 1, d, artifacts) for d in ("none", "sign", "topk:sparsity=0.95")]
    else:
        rows = [_row("mnist", "lenet", b, d, artifacts) for b in (1, 4) for d in DEFENSES]
        rows += [_row("cifar10", "convnet:width=64", 1, d, artifacts, bn_mode="eval") for d in COMPRESSION]
    return {"rows": rows, "artifacts": str(artifacts)}
