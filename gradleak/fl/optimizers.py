"""The client optimizers gradleak replays (`OPTIMIZERS` in `fl.training`), each written
functionally so that an attack can differentiate through it, with torch.optim's semantics (its
`_single_tensor` code paths); tests/fl/test_client_training.py checks them against torch.optim.

An optimizer is a class with a `name`, its `Options` dataclass, the option defaults that differ
from the dataclass's (`option_defaults`), and `step`, one parameter's update; plugins add theirs
with `OPTIMIZERS.register` or the entry point group `gradleak.optimizers`.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from .training import AdamOptions, SGDOptions


class Optimizer:
    name: ClassVar[str] = ""
    Options: ClassVar[type]
    # Defaults this optimizer gives its options where they differ from `Options`' own
    option_defaults: ClassVar[dict[str, Any]] = {}

    @staticmethod
    def step(options: Any, lr: float, step: int, p: torch.Tensor, grad: torch.Tensor,
             memory: dict[str, torch.Tensor]) -> torch.Tensor:
        """Parameter `p` after local step `step` (0 first) with gradient `grad`; `memory` carries
        this parameter's buffers from step to step."""
        raise NotImplementedError


class SGD(Optimizer):
    """SGD with momentum, dampening, Nesterov and weight decay."""

    name = "sgd"
    Options = SGDOptions

    @staticmethod
    def step(options, lr, step, p, grad, memory):
        if options.weight_decay:
            grad = grad + options.weight_decay * p
        if options.momentum:
            buffer = grad if step == 0 else options.momentum * memory["buffer"] + (1 - options.dampening) * grad
            memory["buffer"] = buffer
            grad = grad + options.momentum * buffer if options.nesterov else buffer
        return p - lr * grad


class Adam(Optimizer):
    """Adam, weight decay added to the gradient."""

    name = "adam"
    Options = AdamOptions
    decoupled: ClassVar[bool] = False  # AdamW: weight decay applied to the parameter itself

    @classmethod
    def step(cls, options, lr, step, p, grad, memory):  # type: ignore[override]
        if cls.decoupled:
            p = p * (1 - lr * options.weight_decay)
        elif options.weight_decay:
            grad = grad + options.weight_decay * p
        beta1, beta2, t = options.beta1, options.beta2, step + 1
        first = beta1 * memory["m"] + (1 - beta1) * grad if step else (1 - beta1) * grad
        second = beta2 * memory["v"] + (1 - beta2) * grad * grad if step else (1 - beta2) * grad * grad
        memory["m"], memory["v"] = first, second
        denom = _sqrt(second) / math.sqrt(1 - beta2 ** t) + options.eps
        return p - (lr / (1 - beta1 ** t)) * first / denom


class AdamW(Adam):
    """AdamW: decoupled weight decay, 0.01 by default as torch.optim.AdamW's."""

    name = "adamw"
    decoupled = True
    option_defaults = {"weight_decay": 0.01}


def _sqrt(v: torch.Tensor) -> torch.Tensor:
    """√v with a finite derivative where v = 0 (an entry no step ever moved): its value is
    exactly torch's there (0), and the attacks' second derivative stays finite."""
    return torch.where(v > 0, v.clamp_min(torch.finfo(v.dtype).tiny).sqrt(), torch.zeros_like(v))
