"""DAGER (Petrov et al., NeurIPS 2024) on gradleak's GPT-2 at its seeded random initialisation.

Client: one FedSGD step of next-token prediction on a batch of `news` test windows (Lee news
articles, GPT-2 tokens). Server: `dager_search` on the first two blocks' Q/K/V gradients.

Full: GPT-2 small's width and heads (768, 12) with 2 blocks (DAGER reads only the first two;
more blocks only lengthen the client's backward pass), batches 1/4/16/64 × lengths 16/32/64.
The span test can only be exact while the batch's B·T layer inputs span fewer than
d − 20 = 748 dimensions: the cells with B·T ≥ 748 (16 × 64 and every batch of 64) come back
flagged `saturated`, holding each position's nearest tokens, and their ROUGE shows it.
Quick: the CPU-sized default GPT-2 (width 128, 4 heads), batches 1/4 at length 16 and the
saturated 4 × 32.

Per cell: ROUGE-1/2 and exact-sequence accuracy after Hungarian matching
(gradleak.metrics.text), rows flagged exact, the span ranks used for layers 1 and 2, the
median layer-1 candidates per position, and the server's seconds for the batch.
"""
from __future__ import annotations

import statistics
import time

import torch

from gradleak.attacks.text.dager import dager_search
from gradleak.data import DatasetSpec, load_dataset
from gradleak.metrics.text import score_text
from gradleak.models import ModelSpec
from gradleak.models.building import build
from gradleak.models.gpt2 import build_gpt2, language_model_loss


def client_gradient(model, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    names, params = zip(*model.named_parameters())
    loss = language_model_loss(model(inputs), targets)
    return dict(zip(names, torch.autograd.grad(loss, params)))


def run_cell(batch_size: int, seq_len: int, options: dict, seed: int = 0) -> dict:
    data = load_dataset(DatasetSpec("news", split="test", seq_len=seq_len))
    index = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:batch_size]
    inputs, targets = data.inputs[index], data.labels[index]
    model = build(ModelSpec("gpt2", (seq_len,), data.num_classes, seed=seed, options=options), build_gpt2)
    gradient = client_gradient(model, inputs, targets)
    start = time.perf_counter()
    result = dager_search(model, gradient, batch_size, seq_len)
    seconds = time.perf_counter() - start
    score = score_text(inputs, result.tokens)
    return {"rouge1": round(score.rouge1, 4), "rouge2": round(score.rouge2, 4),
            "exact_sequence_accuracy": round(score.exact_sequence_accuracy, 4),
            "rows_flagged_exact": int(result.exact.sum()), "saturated": result.saturated,
            "span_ranks": list(result.ranks), "median_candidates": statistics.median(result.candidates),
            "seconds": round(seconds, 2)}


def run(quick: bool) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # timings comparable across machines (and unhurt by a busy neighbour)
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool) -> dict:
    if quick:
        options = {"width": 128, "heads": 4}
        cells = [(1, 16), (4, 16), (4, 32)]
    else:
        options = {"width": 768, "heads": 12, "layers": 2}
        cells = [(b, t) for b in (1, 4, 16, 64) for t in (16, 32, 64)]
    out: dict = {"model": {"name": "gpt2", **options}, "cells": {}}
    for batch_size, seq_len in cells:
        out["cells"][f"B{batch_size}_T{seq_len}"] = run_cell(batch_size, seq_len, options)
    out["paper"] = "DAGER (GPT-2, batch ≤ 128 with B·T < d): ROUGE-1/2 > 0.99"
    out["note"] = ("one batch per cell, seed 0; seconds: the server's search on one CPU thread; "
                   "saturated: B·T ≥ width − 20, beyond the span test")
    return out
