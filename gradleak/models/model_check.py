"""The dead-model check: a model whose output ignores its input makes every attack fail,
whatever the defense, so a failed attack on it says nothing."""
from __future__ import annotations

import warnings

import torch
from torch import nn

BLIND_CHECK_EXAMPLES = 8
BLIND_MODEL_MESSAGE = ("the model gives the same output for every input (a collapsed or dead model, e.g. from "
                       "pre-training that diverged): its update says nothing about the data, so every attack "
                       "fails here whatever the defense; audit a model that classifies its inputs")


def warn_if_output_ignores_input(model: nn.Module, inputs: torch.Tensor) -> None:
    """Warn (once per message, as warnings do) when `model` gives the same output for the
    first few of `inputs`: a failed attack on such a model says nothing about a defense."""
    if output_ignores_input(model, inputs[:BLIND_CHECK_EXAMPLES]):
        warnings.warn(BLIND_MODEL_MESSAGE, stacklevel=3)


def output_ignores_input(model: nn.Module, inputs: torch.Tensor, tolerance: float = 1e-4) -> bool:
    """True when `model` maps every one of several different inputs to the same output
    (up to `tolerance` of the output's scale): nothing downstream can depend on the data."""
    if inputs.shape[0] < 2 or bool((inputs == inputs[:1]).all()):
        return False
    device = next(model.parameters(), inputs).device
    modes = [m.training for m in model.modules()]
    model.eval()  # batch norm must not mix the examples, nor update its running statistics
    try:
        with torch.no_grad():
            out = model(inputs.to(device)).flatten(1).double()
    finally:
        for module, mode in zip(model.modules(), modes):
            module.training = mode
    spread = float((out - out[:1]).abs().max())
    return spread <= tolerance * max(float(out.abs().max()), 1e-12)
