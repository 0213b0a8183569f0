"""A plain fully connected network for tabular data (and flattened images)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..options import build_options, check
from .base import ModelSpec, make_activation, size_checked
from .building import act_name, flat_dim


@dataclass(frozen=True)
class MLPOptions:
    hidden: tuple[int, ...] = (256, 256)  # CLI form: hidden=256;128 (empty = logistic regression)

    def __post_init__(self) -> None:
        check(all(h >= 1 for h in self.hidden), "model 'mlp' option 'hidden': every width must be at least 1")


@size_checked
def build_mlp(spec: ModelSpec) -> nn.Module:
    """Flatten → (Linear → act) per hidden width → Linear to the classes."""
    opts: MLPOptions = build_options(MLPOptions, spec.options, "model 'mlp'")
    act = act_name(spec, "relu")
    layers: list[nn.Module] = [nn.Flatten()]
    in_dim = flat_dim(spec)
    for h in opts.hidden:
        layers += [nn.Linear(in_dim, h), make_activation(act)]
        in_dim = h
    layers.append(nn.Linear(in_dim, spec.num_classes))
    return nn.Sequential(*layers)
