"""Functional local training, shared by the client and by attackers.

The client runs it without a graph; gradient-matching attacks run the very same
function with `create_graph=True` to differentiate the simulated update with
respect to candidate data. One code path means an attack matches exactly what
the client computed (Yue et al.'s τ-step FedAvg matching, CPL's local iterations).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .training import SGDOptions, TrainingSpec
from .update import UpdateKind

Tensors = dict[str, torch.Tensor]


def batch_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; `targets` are class indices or (soft) label distributions."""
    if targets.dtype.is_floating_point and targets.dim() == logits.dim():
        return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    return F.cross_entropy(logits, targets)


class StepGradient(Protocol):
    """Computes one local step's gradient; defenses that act during training
    (DP-SGD's per-example clipping, Soteria) provide their own."""

    def __call__(self, model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor,
                 y: torch.Tensor, create_graph: bool) -> Tensors: ...


def plain_gradient(model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor,
                   y: torch.Tensor, create_graph: bool) -> Tensors:
    logits = functional_call(model, (params, buffers), (x,))
    loss = batch_loss(logits, y)
    names = [n for n, p in params.items() if p.requires_grad]
    grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=create_graph)
    return dict(zip(names, grads))


@contextmanager
def batchnorm_mode(model: nn.Module, mode: str) -> Iterator[None]:
    """Switch only the batch-norm layers to `mode` (dropout keeps its own mode)."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    before = [m.training for m in layers]
    for m in layers:
        m.training = mode == "train"
    try:
        yield
    finally:
        for m, flag in zip(layers, before):
            m.training = flag


def local_update(model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor,
                 y: torch.Tensor, training: TrainingSpec, *, create_graph: bool = False,
                 step_gradient: StepGradient = plain_gradient,
                 on_step: Callable[[int, Tensors], None] | None = None) -> tuple[UpdateKind, Tensors]:
    """Run the client's local computation; return (kind, tensors).

    FedSGD returns the gradient; FedAvg returns `params_start - params_end`.
    `params` must require grad (for the client: detached leaves with
    requires_grad; for an attacker: the model's parameters).
    """
    samples = x.shape[0]
    with batchnorm_mode(model, training.batchnorm):
        if training.is_fedsgd:
            return "gradient", step_gradient(model, params, buffers, x, y, create_graph)
        current = dict(params)
        state: dict[str, dict[str, torch.Tensor]] = {}
        for step, idx in enumerate(training.step_indices(samples)):
            index = torch.tensor(idx, device=x.device)
            grads = step_gradient(model, current, buffers, x[index], y[index], create_graph)
            current = optimizer_step(training, step, current, grads, state)
            if not create_graph:
                current = {n: p.detach().requires_grad_(params[n].requires_grad) for n, p in current.items()}
                state = {n: {k: v.detach() for k, v in s.items()} for n, s in state.items()}
            if on_step is not None:
                on_step(step, grads)
    return "delta", {n: params[n] - current[n] for n in params if params[n].requires_grad}


def optimizer_step(training: TrainingSpec, step: int, params: Tensors, grads: Tensors,
                   state: dict[str, dict[str, torch.Tensor]]) -> Tensors:
    """One step of the client's optimizer, written functionally so that an attack can
    differentiate through it, with torch.optim's semantics (its `_single_tensor` code
    paths): SGD with momentum, dampening, Nesterov and weight decay; Adam (weight decay
    added to the gradient); AdamW (decoupled weight decay). `state` carries momentum
    buffers and moments from step to step. Parameters without a gradient stay."""
    lr, options = training.lr, training.optimizer_options
    out = dict(params)
    for name, grad in grads.items():
        p, memory = params[name], state.setdefault(name, {})
        if isinstance(options, SGDOptions):
            if options.weight_decay:
                grad = grad + options.weight_decay * p
            if options.momentum:
                buffer = grad if step == 0 else options.momentum * memory["buffer"] + (1 - options.dampening) * grad
                memory["buffer"] = buffer
                grad = grad + options.momentum * buffer if options.nesterov else buffer
            out[name] = p - lr * grad
            continue
        if training.optimizer_name == "adamw":
            p = p * (1 - lr * options.weight_decay)
        elif options.weight_decay:
            grad = grad + options.weight_decay * p
        beta1, beta2, t = options.beta1, options.beta2, step + 1
        first = beta1 * memory["m"] + (1 - beta1) * grad if step else (1 - beta1) * grad
        second = beta2 * memory["v"] + (1 - beta2) * grad * grad if step else (1 - beta2) * grad * grad
        memory["m"], memory["v"] = first, second
        denom = _sqrt(second) / math.sqrt(1 - beta2 ** t) + options.eps
        out[name] = p - (lr / (1 - beta1 ** t)) * first / denom
    return out


def _sqrt(v: torch.Tensor) -> torch.Tensor:
    """√v with a finite derivative where v = 0 (an entry no step ever moved): its value is
    exactly torch's there (0), and the attacks' second derivative stays finite."""
    return torch.where(v > 0, v.clamp_min(torch.finfo(v.dtype).tiny).sqrt(), torch.zeros_like(v))


def model_state(model: nn.Module, *, requires_grad: bool = True) -> tuple[Tensors, Tensors]:
    """Detached copies of a model's parameters and buffers for functional use."""
    params = {n: p.detach().clone().requires_grad_(requires_grad and p.requires_grad)
              for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return params, buffers
