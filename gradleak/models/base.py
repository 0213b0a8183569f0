"""The spec every model builder receives."""
from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import GradleakError
from ..options import MAX_ACTIVATIONS, MAX_PARAMETERS, check_size

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


# transformers' initialisation (GPT-2, BERT): N(0, 0.02) weights of every linear and embedding layer
TRANSFORMER_INIT_STD = 0.02


@torch.no_grad()
def transformer_init(model: nn.Module, std: float = TRANSFORMER_INIT_STD) -> None:
    """N(0, std²) weights for every linear and embedding layer, zero linear biases (GPT-2's and
    BERT's initialisation), drawn from the global generator in module order."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.zero_()


def size_checked(builder):
    """Wrap a registered model builder: build the architecture on the meta device first
    (no memory, no random draws), refuse it when its parameters or one example's
    activations exceed the documented maximums, then build it for real."""
    @functools.wraps(builder)
    def build(spec: ModelSpec) -> nn.Module:
        check_model_size(spec, builder)
        return builder(spec)
    return build


def check_model_size(spec: ModelSpec, builder) -> None:
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                probe = builder(spec)
        except GradleakError:
            raise
        except Exception:  # the real build reports its own error
            return
        params = sum(p.numel() for p in probe.parameters())
        check_size(f"model '{spec.name}'", params, MAX_PARAMETERS, "parameters")
        total = [math.prod(spec.input_shape)]

        def count(_module, _inputs, output):
            if isinstance(output, torch.Tensor):
                total[0] += output.numel()

        leaves = [m for m in probe.modules() if not list(m.children())]
        handles = [m.register_forward_hook(count) for m in leaves]
        try:
            probe(torch.empty(1, *spec.input_shape, device="meta"))
        except Exception:  # a shape problem is reported by the real build's own checks
            return
        finally:
            for handle in handles:
                handle.remove()
        check_size(f"model '{spec.name}' on inputs {tuple(spec.input_shape)}", total[0], MAX_ACTIVATIONS,
                   "activations per example")


def hash_weights(digest, model) -> None:
    """Feed every tensor of `model`'s state dict, with its name, into `digest` (a hashlib
    object): the one weight digest (audited models, kept inverters)."""
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())



def model_digest(model: nn.Module) -> str:
    """A short digest of a model's class and weights (an audit's record of what it audited)."""
    h = hashlib.sha256(type(model).__qualname__.encode())
    hash_weights(h, model)
    return h.hexdigest()[:16]
