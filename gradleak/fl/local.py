"""Functional local training, shared by the client and by attackers.

The client runs it without a graph; gradient-matching attacks run the very same
function with `create_graph=True` to differentiate the simulated update with
respect to candidate data. One code path means an attack matches exactly what
the client computed (Yue et al.'s τ-step FedAvg matching, CPL's local iterations).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..data.modality import modality_of_tensors
from ..modalities import Modality
from ..modalities import modality as modality_of
from .training import OPTIMIZERS, TrainingSpec
from .update import UpdateKind

Tensors = dict[str, torch.Tensor]


def batch_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy; `targets` are class indices or (soft) label distributions;
    `label_smoothing` ε as `F.cross_entropy`'s (the target (1 − ε)·y + ε/K). Per-position
    logits (B, T, K) with index targets (B, T) (a language model's next tokens) average over
    every position."""
    if logits.dim() == 3 and not targets.dtype.is_floating_point and targets.shape == logits.shape[:2]:
        logits, targets = logits.flatten(0, 1), targets.flatten()
    if targets.dtype.is_floating_point and targets.dim() == logits.dim():
        if label_smoothing:
            targets = targets * (1 - label_smoothing) + label_smoothing / logits.shape[-1]
        return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    return F.cross_entropy(logits, targets, label_smoothing=label_smoothing)


class StepGradient(Protocol):
    """Computes one local step's gradient; defenses that act during training
    (DP-SGD's per-example clipping, Soteria) provide their own."""

    def __call__(self, model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor,
                 y: torch.Tensor, create_graph: bool) -> Tensors: ...


def loss_gradient(label_smoothing: float = 0.0) -> StepGradient:
    """The step gradient of the mean cross-entropy with the client's label smoothing."""

    def gradient(model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor,
                 y: torch.Tensor, create_graph: bool) -> Tensors:
        logits = functional_call(model, (params, buffers), (x,))
        loss = batch_loss(logits, y, label_smoothing)
        names = [n for n, p in params.items() if p.requires_grad]
        grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=create_graph)
        return dict(zip(names, grads))

    return gradient


plain_gradient = loss_gradient()


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
                 step_gradient: StepGradient | None = None,
                 on_step: Callable[[int, Tensors], None] | None = None,
                 steps: list[tuple[int, ...]] | None = None,
                 augment_generator: torch.Generator | None = None,
                 modality: Modality | None = None) -> tuple[UpdateKind, Tensors]:
    """Run the client's local computation; return (kind, tensors).

    FedSGD returns the gradient; FedAvg returns `params_start - params_end`.
    `params` must require grad (for the client: detached leaves with
    requires_grad; for an attacker: the model's parameters). `step_gradient` defaults to the
    training's loss (`loss_gradient`); defenses that act during training wrap it. `steps` overrides the example
    indices of every local step (`training.step_indices`); an attack that gives each epoch
    its own copy of the examples lays them out this way. The training's augmentation is
    drawn from `augment_generator` (the client's); without one the examples pass unchanged,
    which is all a server can replay; `modality` augments it (without one: the modality the
    tensors declare).
    """
    samples = x.shape[0]
    if step_gradient is None:
        step_gradient = loss_gradient(training.label_smoothing)
    augment = training.augment if augment_generator is not None else ()
    with batchnorm_mode(model, training.batchnorm):
        if training.is_fedsgd and steps is None:
            inputs = augmented(x, augment, training.crop_padding, augment_generator, modality)
            grads = step_gradient(model, params, buffers, inputs, y, create_graph)
            return "gradient", clipped(grads, training.clip_norm)
        current = dict(params)
        state: dict[str, dict[str, torch.Tensor]] = {}
        for step, idx in enumerate(steps if steps is not None else training.step_indices(samples)):
            index = torch.tensor(idx, device=x.device)
            inputs = augmented(x[index], augment, training.crop_padding, augment_generator, modality)
            grads = clipped(step_gradient(model, current, buffers, inputs, y[index], create_graph),
                            training.clip_norm)
            current = optimizer_step(training, step, current, grads, state)
            if not create_graph:
                current = {n: p.detach().requires_grad_(params[n].requires_grad) for n, p in current.items()}
                state = {n: {k: v.detach() for k, v in s.items()} for n, s in state.items()}
            if on_step is not None:
                on_step(step, grads)
    return "delta", {n: params[n] - current[n] for n in params if params[n].requires_grad}


def clipped(grads: Tensors, max_norm: float | None) -> Tensors:
    """The step's gradient clipped to `max_norm` in total L2 norm, exactly as
    `torch.nn.utils.clip_grad_norm_` scales it (coefficient max_norm / (norm + 1e-6), at most 1)."""
    if max_norm is None:
        return grads
    norm = torch.stack([g.pow(2).sum() for g in grads.values()]).sum().sqrt()
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return {n: g * coefficient for n, g in grads.items()}


def augmented(x: torch.Tensor, augment: tuple[str, ...], padding: int, generator: torch.Generator | None,
              modality: Modality | None = None) -> torch.Tensor:
    """The batch under the training's augmentation, as the data's modality augments it
    (`Modality.augmented`: pictures are cropped and flipped, other data pass unchanged);
    without a modality, the one the tensors declare (gradleak.data.modality)."""
    if not augment or generator is None:
        return x
    kind = modality if modality is not None else modality_of(modality_of_tensors(x))
    return kind.augmented(x, augment, padding, generator)


def optimizer_step(training: TrainingSpec, step: int, params: Tensors, grads: Tensors,
                   state: dict[str, dict[str, torch.Tensor]]) -> Tensors:
    """One step of the client's optimizer, written functionally so that an attack can
    differentiate through it, with torch.optim's semantics (its `_single_tensor` code
    paths): the registered optimizer's `step` (`fl.optimizers`: SGD with momentum, dampening,
    Nesterov and weight decay; Adam; AdamW) on every parameter. `state` carries momentum
    buffers and moments from step to step. Parameters without a gradient stay."""
    lr, options = training.lr, training.optimizer_options
    optimizer = OPTIMIZERS.get(training.optimizer_name)
    out = dict(params)
    for name, grad in grads.items():
        out[name] = optimizer.step(options, lr, step, params[name], grad, state.setdefault(name, {}))
    return out


def model_state(model: nn.Module, *, requires_grad: bool = True) -> tuple[Tensors, Tensors]:
    """Detached copies of a model's parameters and buffers for functional use."""
    params = {n: p.detach().clone().requires_grad_(requires_grad and p.requires_grad)
              for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return params, buffers
