"""The buffers a client sends with its update, and the batch statistics they give a server.

A client that returns its whole state dict (a Flower client does) sends its batch-norm
running statistics too. In a train-mode forward pass PyTorch's batch norm updates them as

    running_mean ← (1 − m)·running_mean + m·batch_mean
    running_var  ← (1 − m)·running_var  + m·batch_var·n/(n − 1)     (the unbiased variance)
    num_batches_tracked ← num_batches_tracked + 1

with m the layer's `momentum`, or 1/num_batches_tracked (after the increment) when its
momentum is None (a cumulative average); n is the number of values per channel (batch ×
spatial positions). The server sent the statistics before training and knows m (it is the
model), so one train-mode local step on the whole batch gives that batch's per-layer mean
and biased variance exactly.

Nothing is derived otherwise. After T steps the statistics hold
(1 − m)^T·old + Σ_t m(1 − m)^(T−t)·stat_t, a weighted mix of T batches' statistics taken at
T different weights, from which no one batch's statistics follow; a step on part of the
batch gives that part's; batch norm in eval mode leaves them as sent; an aggregate of several
clients averages their unbiased variances, which is not the pooled batch's variance.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import GradleakError
from .training import TrainingSpec

Tensors = dict[str, torch.Tensor]
# One (mean, biased variance) per batch-norm layer, in module order.
BatchStatistics = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class SentStatistics:
    """What a client's sent buffers give the server: its batch's statistics, or why not."""

    statistics: BatchStatistics | None
    reason: str = ""


def batchnorm_layers(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    """(name, layer) of every batch-norm layer, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def sent_buffers(model: nn.Module, running: Tensors) -> Tensors:
    """The buffers a client returning its state dict sends: the persistent ones, detached."""
    persistent = set(model.state_dict())
    return {name: tensor.detach().clone() for name, tensor in running.items() if name in persistent}


def check_sent_buffers(model: nn.Module, buffers: Tensors) -> None:
    """One line for buffers that are not the model's: an unknown name, another shape, a NaN."""
    own = dict(model.named_buffers())
    for name, tensor in buffers.items():
        if not isinstance(tensor, torch.Tensor):
            raise GradleakError(f"sent buffer '{name}' is a {type(tensor).__name__}, not a tensor")
        if name not in own:
            raise GradleakError(f"sent buffer '{name}' is not a buffer of the model")
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise GradleakError(f"sent buffer '{name}' has shape {tuple(tensor.shape)}, the model's buffer "
                                f"{tuple(own[name].shape)}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise GradleakError(f"sent buffer '{name}' contains NaN or infinity")


def why_no_batch_statistics(training: TrainingSpec, samples: int, clients: int = 1) -> str | None:
    """Why the buffers sent after `training` on a batch of `samples` examples (summed over
    `clients` clients) do not give the batch's statistics exactly; None when they do."""
    if training.batchnorm != "train":
        return "batch norm in eval mode leaves the running statistics as sent"
    steps, step_batch = training.num_steps(samples), training.step_batch_size(samples)
    if steps != 1:
        return (f"they are derived after one local step only; after {steps} the running statistics mix "
                "every step's batch statistics")
    if step_batch != samples:
        return f"the one local step saw {step_batch} of the batch's {samples} examples"
    if clients > 1:
        return "an aggregate of several clients' buffers averages their statistics"
    return None


def statistics_from_buffers(model: nn.Module, sent: Tensors, training: TrainingSpec, samples: int,
                            input_shape: tuple[int, ...], clients: int = 1) -> SentStatistics:
    """The per-layer (mean, biased variance) of the batch of `samples` examples a client took
    its one train-mode local step on, in module order (as `threat.capture_bn_statistics`
    gives them), from the buffers it sent and the model's own (those the server sent)."""
    check_sent_buffers(model, sent)
    reason = why_no_batch_statistics(training, samples, clients)
    layers = batchnorm_layers(model)
    if reason is None and not layers:
        reason = "the model has no batch-norm layer"
    if reason is not None:
        return SentStatistics(None, reason)
    values = values_per_channel(model, input_shape)
    out: BatchStatistics = []
    for name, layer in layers:
        key = f"{name}." if name else ""
        if layer.running_mean is None or layer.running_var is None:
            return SentStatistics(None, f"batch-norm layer '{name}' keeps no running statistics")
        if f"{key}running_mean" not in sent or f"{key}running_var" not in sent:
            return SentStatistics(None, f"the client sent no running statistics of layer '{name}'")
        tracked_before, tracked_after = layer.num_batches_tracked, sent.get(f"{key}num_batches_tracked")
        if tracked_before is not None and tracked_after is not None:
            counted = int(tracked_after) - int(tracked_before)
            if counted != 1:
                return SentStatistics(None, f"layer '{name}' counted {counted} batches in this round, not the one "
                                            "local step declared")
        if layer.momentum is None:
            if tracked_after is None:
                return SentStatistics(None, f"layer '{name}' averages cumulatively (momentum None) and the client "
                                            "sent no num_batches_tracked")
            factor = 1.0 / float(tracked_after)
        else:
            factor = float(layer.momentum)
        if factor <= 0:
            return SentStatistics(None, f"layer '{name}' has momentum 0: its running statistics never change")
        if name not in values:
            return SentStatistics(None, f"batch-norm layer '{name}' is not reached by a forward pass")
        n = samples * values[name]
        if n < 2:
            return SentStatistics(None, f"layer '{name}' normalises a single value per channel")
        # in float64: dividing by m magnifies the float32 rounding of the sent statistics 1/m-fold
        keep = 1.0 - factor
        mean = (sent[f"{key}running_mean"].double() - keep * layer.running_mean.double()) / factor
        unbiased = (sent[f"{key}running_var"].double() - keep * layer.running_var.double()) / factor
        variance = (unbiased * (n - 1) / n).clamp_min(0.0)
        out.append((mean.to(layer.running_mean.dtype), variance.to(layer.running_var.dtype)))
    return SentStatistics(out)


def values_per_channel(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, int]:
    """How many values per channel each batch-norm layer normalises for one example (its
    input's spatial size), from a forward pass of one blank example with every layer in
    eval mode (no dropout draws); the model's buffers are not touched (they travel as a copy)."""
    from torch.func import functional_call

    names = {layer: name for name, layer in batchnorm_layers(model)}
    counts: dict[str, int] = {}

    def record(layer, inputs, _output):
        h = inputs[0]
        counts.setdefault(names[layer], h[0].numel() // h.shape[1])

    reference = next(model.parameters(), None)
    device = reference.device if reference is not None else torch.device("cpu")
    dtype = reference.dtype if reference is not None else torch.float32
    modes = [(module, module.training) for module in model.modules()]
    handles = [layer.register_forward_hook(record) for layer in names]
    try:
        for module, _ in modes:
            module.training = False
        buffers = {n: b.clone() for n, b in model.named_buffers()}
        with torch.no_grad():
            functional_call(model, buffers, (torch.zeros((1, *input_shape), device=device, dtype=dtype),))
    finally:
        for handle in handles:
            handle.remove()
        for module, mode in modes:
            module.training = mode
    return counts
