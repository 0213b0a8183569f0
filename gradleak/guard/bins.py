"""Outbound: pairs of a dense layer's rows whose update difference is one of the client's examples.

A binning imprint (Robbing the Fed's, loki's, scale-mia's; disguised or not) reads an example as
the difference of two rows' updates: two units active for the same examples but one, which
receive the same back-propagated signal, so that (Δw_k − Δw_l) / (Δb_k − Δb_l) is that example's
input to the layer. An honest layer's units receive different signals, so no such difference is
an example. The client knows its examples and the model it trained, so before sending it can
check every such pair of every dense layer with a bias: a model crafted to pass the inbound
checks (scale-mia's disguise, in a client's first round) cannot pass this one, since its bins
must isolate the examples to leak them. A unit active for one example alone is not a pair: its
row reveals that example's input to an honest server as well, which the audit's attacks judge.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ..fl.update import Update

# a pair's difference, written over the inputs of the examples active in its upper row: the
# example's coefficient within this of 1 and every other's within it of 0
EXACT = 1e-3
MAX_UNITS = 8192  # wider layers are left to the audit (the pairs grow with the square of the units)


@dataclass(frozen=True)
class BinnedPair:
    """Two rows of `layer` whose update difference is the input of example `example`."""

    layer: str
    rows: tuple[int, int]
    example: int
    cosine: float

    def __str__(self) -> str:
        return (f"{self.layer}: rows {self.rows[0]} and {self.rows[1]} differ by example {self.example}'s input "
                f"(cosine {self.cosine:.4f})")


def binned_pairs(model: nn.Module, update: Update, inputs: torch.Tensor) -> list[BinnedPair]:
    """The pairs of rows, in every dense layer with a bias, whose update difference is one of
    `inputs`' inputs to the layer (at most one pair per example and layer)."""
    layers = {name: layer for name, layer in model.named_modules()
              if isinstance(layer, nn.Linear) and layer.bias is not None and layer.out_features <= MAX_UNITS
              and f"{name}.weight" in update.tensors and f"{name}.bias" in update.tensors}
    if not layers:
        return []
    seen = layer_inputs(model, list(layers), inputs)
    found: list[BinnedPair] = []
    for name, layer in layers.items():
        features = seen.get(name)
        if features is None or features.shape[1] != layer.in_features:
            continue  # not reached, or applied per position (a transformer's layers): not bins
        with torch.no_grad():
            active = (features @ layer.weight.double().T + layer.bias.double() > 0).T  # units × examples
        found += _pairs(name, active, update.tensors[f"{name}.weight"].double(),
                        update.tensors[f"{name}.bias"].double(), features)
    return found


def layer_inputs(model: nn.Module, names: list[str], inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each named layer's input for `inputs`, flattened per example, from one forward pass of a
    copy of the model (its mode kept: batch norm in train mode would otherwise update the
    client's running statistics)."""
    replica = copy.deepcopy(model)
    captured: dict[str, torch.Tensor] = {}
    hooks = [replica.get_submodule(name).register_forward_pre_hook(
        lambda _module, args, name=name: captured.__setitem__(name, args[0].detach())) for name in names]
    try:
        with torch.no_grad():
            replica(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return {name: captured[name].flatten(1).double() for name in names if name in captured}


def _pairs(name: str, active: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
           seen: torch.Tensor) -> list[BinnedPair]:
    # one row per pattern of active examples (a binning layer repeats each pattern over many
    # units, whose rows then carry the same update)
    patterns, inverse = torch.unique(active, dim=0, return_inverse=True)
    first = torch.full((len(patterns),), len(inverse), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(inverse)), reduce="amin")
    active, weight, bias = patterns, weight[first], bias[first]
    counts = active.sum(1)
    found: dict[int, BinnedPair] = {}
    for count in sorted(set(counts.tolist()) - {0}):
        upper, lower = (counts == count + 1).nonzero().flatten(), (counts == count).nonzero().flatten()
        if not len(upper) or not len(lower):
            continue
        # lower ⊂ upper: no example active below and not above
        inside = ~(active[lower][:, None, :] & ~active[upper][None, :, :]).any(2)  # lower × upper
        for a, b in inside.nonzero().tolist():
            low, high = int(lower[a]), int(upper[b])
            example = int((active[high] & ~active[low]).nonzero()[0])
            if example in found:
                continue
            scale = bias[high] - bias[low]
            if scale.abs() <= 1e-12 * bias.abs().max().clamp_min(1e-300):
                continue
            recovered = (weight[high] - weight[low]) / scale
            # the difference as a combination of the examples active in the upper row: a bin
            # holds the one example alone (its coefficient 1, the others' 0, to float32's
            # rounding); an honest pair only comes near it when the others' signals nearly agree
            others = active[high].nonzero().flatten()
            coefficients = torch.linalg.lstsq(seen[others].T, recovered[:, None]).solution[:, 0]
            own = int((others == example).nonzero()[0])
            rest = torch.cat([coefficients[:own], coefficients[own + 1:]])
            stray = float(rest.abs().max()) if len(rest) else 0.0
            if abs(float(coefficients[own]) - 1) <= EXACT and stray <= EXACT:
                cosine = float(nn.functional.cosine_similarity(recovered, seen[example], dim=0))
                found[example] = BinnedPair(name, (int(first[high]), int(first[low])), example, cosine)
    return list(found.values())
