"""Clients that train as real apps do: what each attack recovers when the server replays the
client's training exactly, assumes plain SGD in order, or cannot know the order.

Each row is one client (printed to stderr as it finishes; the full run takes hours on 2
cores): `batch` examples trained `epochs` local epochs in mini-batches of `local_batch` —
MNIST with LeNet-5 (the DLG LeNet's sigmoid stack is not reconstructed beyond batch 1 by any
attack here) — with SGD at lr 0.01, momentum 0.9 and weight decay 5e-4 (the usual PyTorch
recipe) and a shuffling DataLoader. The server attacks the client's update with
- `plain`: Inverting Gradients that assumes what gradleak simulated before clients could
  declare their training: plain SGD over mini-batches in order;
- `replay`: Inverting Gradients replaying the client's optimizer and its known order;
- `fedavg-known`: Dimitrov et al.'s attack with the order known (the exact replay, with the
  recovered labels' arrangement over the mini-batches optimised);
- `fedavg-unknown`: the same client shuffling with a seed the server never learns, attacked
  by Dimitrov et al.'s attack (an attack that replays an order cannot run there).
Scores: mean PSNR, SSIM, and re-identification among 1,000 examples of the other split
(`gradleak.metrics.reidentify`), through `gradleak.audit_update` (the auditor's budget ladder,
`quick`: up to two doublings while undecided).

The full run adds Dimitrov et al.'s FEMNIST setting on MNIST (50 images: 10 local epochs of
10 mini-batches of 5, plain SGD as theirs, order unknown) and a cifar10 ConvNet row.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time

import torch

from gradleak.api import audit_update
from gradleak.data import load_dataset
from gradleak.data.references import dataset_spec
from gradleak.fl import TrainingSpec
from gradleak.fl.client import compute_update
from gradleak.models.references import build_named_model

RECIPE = "sgd:momentum=0.9,weight_decay=5e-4"


def _client_row(dataset: str, model_name: str, batch: int, local_batch: int, epochs: int, lr: float,
                seed: int, iterations: int, optimizer: str = RECIPE, variants: tuple[str, ...] = (
                    "plain", "replay", "fedavg-known", "fedavg-unknown")) -> dict:
    test = load_dataset(dataset_spec(dataset, "test", None))
    train = load_dataset(dataset_spec(dataset, "train", None))
    pick = torch.randperm(len(test.labels), generator=torch.Generator().manual_seed(seed))[:batch]
    x, y = test.inputs[pick], test.labels[pick]
    gallery = train.inputs[torch.randperm(len(train.labels), generator=torch.Generator().manual_seed(99))[:1000]]
    # the offline cifar10 samples are one set of 20 for both splits: never the client's own examples
    gallery = gallery[torch.tensor([not any(torch.equal(g, t) for t in x) for g in gallery])]
    model = build_named_model(model_name, tuple(test.input_shape), test.num_classes, seed=seed,
                              modality=test.modality)
    known = TrainingSpec(lr=lr, local_epochs=epochs, local_batch_size=local_batch, optimizer=optimizer,
                         shuffle_seed=seed + 1)
    unknown = dataclasses.replace(known, shuffle="unknown")
    plain = TrainingSpec(lr=lr, local_epochs=epochs, local_batch_size=local_batch)
    cases = {
        "plain": (known, plain, f"ig:iterations={iterations}"),
        "replay": (known, known, f"ig:iterations={iterations}"),
        "fedavg-known": (known, known, f"fedavg:iterations={iterations}"),
        "fedavg-unknown": (unknown, unknown.server_view(), f"fedavg:iterations={iterations}"),
    }
    row: dict = {"dataset": dataset, "model": model_name, "batch": batch, "local_batch": local_batch,
                 "epochs": epochs, "optimizer": optimizer, "lr": lr, "seed": seed}
    for name in variants:
        client, declared, attack = cases[name]
        update = compute_update(model, x, y, client, generator=torch.Generator().manual_seed(seed))
        start = time.perf_counter()
        result = audit_update(model, update, x, y, training=declared, attacks=[attack], seed=seed,
                              budget="quick", gallery=gallery, data_label=dataset, model_label=model_name)
        if not result.runs:
            row[name] = {"skipped": result.skipped[0].reason if result.skipped else "did not run"}
            continue
        m = result.runs[0].metrics
        ladder = result.runs[0].extras.get("ladder") or {}
        row[name] = {"psnr": round(m["psnr"], 2), "ssim": round(m["ssim"], 3), "reid": m.get("reid"),
                     "copied": m.get("asr"), "iterations": ladder.get("iterations"),
                     "decision": ladder.get("decision"), "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(row), file=sys.stderr, flush=True)  # each client as it finishes: the full run is long
    return row


def run(quick: bool) -> dict:
    torch.set_num_threads(1)
    seeds = (0,) if quick else (0, 1)
    rows = [_client_row("mnist", "lenet5", 8, 4, 2, 0.01, s, 300 if quick else 1000) for s in seeds]
    if not quick:
        rows += [_client_row("mnist", "lenet5", 16, 8, 3, 0.01, s, 1000) for s in seeds]
        rows.append(_client_row("cifar10", "convnet:width=16", 8, 4, 2, 0.01, 0, 1000))
        # Dimitrov et al.'s setting: 10 epochs × 10 mini-batches × 5 images, plain SGD at their
        # client learning rate
        rows.append(_client_row("mnist", "lenet5", 50, 5, 10, 0.004, 0, 1000, optimizer="sgd",
                                variants=("plain", "fedavg-unknown")))
    return {"rows": rows}
