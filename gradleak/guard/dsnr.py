"""The disaggregation signal-to-noise ratio (D-SNR) of a received model on a client's batch.

Garov et al. (SEER, ICLR 2024) measure how far a model singles out one example of a batch: per
weight tensor, the largest per-example gradient norm over the mean norm of the others, the
largest over the tensors. It needs the client's data, so only a client can compute it; gradleak
reports it beside each crafted model (benchmarks/pipeline/bench_guard.py, docs/guard.md), not as
one of the guard's checks: on MNIST batches of 8 through LeNet-5 (seeds 0–4) honest models read
1.5–2.2, class fishing infinity (the head passes one class's gradient only), Robbing the Fed and
loki 2.3–5.7 (their cumulative bins take a gradient from every example) and MKOR 1.8–2.6, which
the inbound checks' structure findings catch and D-SNR does not.
"""
from __future__ import annotations

import torch
from torch import nn

from ..defenses.dpsgd import per_example_gradients


def disaggregation_snr(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    """max over weight tensors W of max_i ‖∇_W ℓ(x_i)‖ / mean_{j≠i} ‖∇_W ℓ(x_j)‖, on a batch of
    at least two examples (the model in eval mode: no batch statistics)."""
    if len(inputs) < 2:
        raise ValueError("D-SNR compares an example's gradient with the others': a batch of two or more")
    was_training = model.training
    model.eval()
    try:
        params = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
        buffers = {n: b for n, b in model.named_buffers()}
        grads = per_example_gradients(model, params, buffers, inputs, labels)
    finally:
        model.train(was_training)
    batch, worst = len(inputs), 0.0
    for tensor in grads.values():
        if tensor.dim() < 3:  # (batch, *shape): weights only, as SEER; biases and norms left out
            continue
        norms = tensor.detach().flatten(1).double().norm(dim=1)
        top = int(norms.argmax())
        rest = (norms.sum() - norms[top]) / (batch - 1)
        ratio = float(norms[top] / rest) if rest > 0 else (float("inf") if norms[top] > 0 else 0.0)
        worst = max(worst, ratio)
    return worst
