"""SPEAR: exact batch recovery through a dense+ReLU layer, per batch size: the fraction of examples
recovered exactly (MSE ≤ 1e-6 on standardised features / pixels / features), the fraction of
batches recovered whole, the draws and seconds per batch. Adult through the 2×256 ReLU mlp at
B = 8, 16, 25; MNIST through the same mlp at B = 16; the 400 conv features entering lenet5's
fc120 (ReLU) at B = 4 and 8. Each batch climbs the ladder (65536 draws, doubling) until verified."""
from __future__ import annotations

import torch

from benchmarks.attacks.common import spear_batch
from gradleak.data import DatasetSpec, load_dataset
from gradleak.models import ModelSpec


def _case(name: str, data, model_spec, batch: int, seeds: int, doublings: int, features: str | None = None) -> dict:
    runs = []
    for seed in range(seeds):
        spec = ModelSpec(model_spec.name, model_spec.input_shape, model_spec.num_classes, seed=seed,
                         options=model_spec.options, activation=model_spec.activation)
        runs.append(spear_batch(data, spec, batch, seed, doublings, features))
    seconds = sorted(r["seconds"] for r in runs)
    return {"case": name, "batch": batch, "seeds": seeds,
            "exact_fraction": round(sum(r["exact"] for r in runs) / (batch * seeds), 4),
            "whole_batches": sum(r["exact"] == batch for r in runs),
            "verified": sum(r["verified"] for r in runs),
            "draws_median": sorted(r["draws"] for r in runs)[seeds // 2],
            "seconds_median": round(seconds[seeds // 2], 2), "seconds_max": round(seconds[-1], 2)}


def run(quick: bool) -> dict:
    torch.set_num_threads(1)
    adult = load_dataset(DatasetSpec("adult", split="test"))
    mnist = load_dataset(DatasetSpec("mnist", split="test"))
    tabular = ModelSpec("mlp", tuple(adult.inputs.shape[1:]), 2)
    rows = []
    for batch, seeds in ((8, 3 if quick else 10), (16, 2 if quick else 10), (25, 1 if quick else 4)):
        rows.append(_case("adult|mlp", adult, tabular, batch, seeds, doublings=3))
    rows.append(_case("mnist|mlp", mnist, ModelSpec("mlp", (1, 28, 28), 10), 16, 2 if quick else 6, doublings=3))
    conv = ModelSpec("lenet5", (1, 28, 28), 10, activation="relu")
    for batch in (4, 8):
        rows.append(_case("mnist|lenet5-relu features of fc120", mnist, conv, batch, 2 if quick else 6,
                          doublings=1, features="7"))
    return {"table": rows}
