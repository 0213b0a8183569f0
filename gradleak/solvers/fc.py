"""Fully connected layer inversion shared by fc-analytic, rtf, fishing and cpa.

For a linear layer z = W x + b that sees the input x directly, the weight and bias gradients of
a batch are ∂L/∂W = Σ_i δ_i x_iᵀ and ∂L/∂b = Σ_i δ_i (δ_i = ∂L/∂z_i). A row c whose δ_ic is
non-zero for exactly one sample gives that sample exactly: x = ∂L/∂W[c,:] / ∂L/∂b[c].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import GradleakError


@dataclass(frozen=True)
class FirstLinear:
    name: str
    module: nn.Linear
    on_input: bool  # True: it sees the flattened input; False: it sits behind convolutions etc.


def locate_first_linear(model: nn.Module, input_shape: tuple[int, ...]) -> FirstLinear:
    """The model's first nn.Linear (module order), and whether it sees the raw input."""
    behind = False
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            on_input = not behind and module.in_features == math.prod(input_shape)
            return FirstLinear(name, module, on_input)
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            behind = True
    raise GradleakError("the model has no fully connected layer")


def first_linear(model: nn.Module, input_shape: tuple[int, ...]) -> tuple[str, nn.Linear]:
    """(name, module) of the first nn.Linear, which must see the flattened input directly."""
    found = locate_first_linear(model, input_shape)
    if not found.on_input:
        raise GradleakError(
            f"the model's first layer is not fully connected on the input (its first linear layer "
            f"'{found.name}' sees {found.module.in_features} features, the input has "
            f"{math.prod(input_shape)}): use a model such as mlp")
    return found.name, found.module


def layer_gradients(update_tensors: dict[str, torch.Tensor], name: str, need_bias: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = update_tensors.get(f"{name}.weight")
    bias = update_tensors.get(f"{name}.bias")
    if weight is None:
        raise GradleakError(f"the update has no gradient for layer '{name}'")
    if need_bias and bias is None:
        raise GradleakError(f"layer '{name}' has no bias: FC inversion needs ∂L/∂b "
                            "(use a model with biases, e.g. mlp; twolayer is bias-free)")
    return weight.detach().double(), None if bias is None else bias.detach().double()


def row_ratios(g_weight: torch.Tensor, g_bias: torch.Tensor, rel_threshold: float = 1e-4
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates ∂L/∂W[c]/∂L/∂b[c] for every row with a usable bias gradient, and |∂L/∂b[c]|."""
    scale = g_bias.abs().max()
    if float(scale) == 0.0:
        raise GradleakError("the bias gradient is zero: nothing to invert")
    rows = (g_bias.abs() > rel_threshold * scale).nonzero().flatten()
    return g_weight[rows] / g_bias[rows, None], g_bias[rows].abs()


def distinct_consensus(candidates: torch.Tensor, weights: torch.Tensor, k: int, tolerance: float
                       ) -> torch.Tensor:
    """Up to k candidates that many rows agree on (a row active for one sample reproduces that
    sample exactly; rows mixing samples scatter), with non-maximum suppression."""
    dist = torch.cdist(candidates, candidates) / math.sqrt(candidates.shape[1])  # RMS distance
    close = dist <= tolerance
    support = (close.double() * weights[None, :]).sum(1)
    chosen: list[int] = []
    taken = torch.zeros(len(candidates), dtype=torch.bool)
    for idx in torch.argsort(support, descending=True).tolist():
        if taken[idx]:
            continue
        chosen.append(idx)
        taken |= close[idx]
        if len(chosen) == k:
            break
    return candidates[chosen]
