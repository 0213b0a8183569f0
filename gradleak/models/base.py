"""The spec every model builder receives."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

ACTIVATIONS = ("relu", "sigmoid", "tanh", "leakyrelu")


def make_activation(name: str) -> nn.Module:
    """relu | sigmoid | tanh | leakyrelu (slope 0.2, as used in gradient-leakage studies)."""
    if name == "relu":
        return nn.ReLU()
    if name == "sigmoid":
        return nn.Sigmoid()
    if name == "tanh":
        return nn.Tanh()
    if name == "leakyrelu":
        return nn.LeakyReLU(0.2)
    raise ValueError(f"unknown activation '{name}'")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture name plus the data it must fit.

    `input_shape` is (C, H, W) for images or (D,) for tabular data.
    `activation` None means the architecture's own default.
    `options` are builder-specific (e.g. width, batchnorm) as parsed from `name:key=value`.
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    activation: str | None = None
    seed: int = 0
    options: dict = field(default_factory=dict, hash=False, compare=False)
