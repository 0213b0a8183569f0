"""Exact, faster replay of local training for models that end in a wide linear head.

Unrolling τ local SGD steps differentiably (`UpdateSimulator`) materialises the
head weight W_s = W_0 − η Σ_{s'<s} E_{s'}ᵀH_{s'} at every step, where H are the
head's input features and E = ∂L/∂logits. For ROG's setting (LeNet at 128 px
with 1000 classes) W is 1000 × 12288: each step then streams several 49 MB
tensors forward and backward, and elementwise traffic, not arithmetic,
dominates the cost of an attack iteration.

The head's updates are low rank, so the logits of step s are

    H_s W_sᵀ = H_s W_0ᵀ − η Σ_{s'<s} (H_s H_{s'}ᵀ) E_{s'},

which needs only W_0 (a constant) and small Gram products. The body's
gradients follow from autograd on these logits (∂L/∂H_s = E_s W_s), and the
head's delta η Σ_s E_sᵀH_s is formed once at the end. The result is the same
update as `fl.local.local_update` with the plain gradient, up to float rounding
(tests/test_rog.py checks values and input gradients).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from ..fl.local import batch_loss
from ..threat import Observation
from .matching import UpdateSimulator

Tensors = dict[str, torch.Tensor]


def low_rank_head_applies(obs: Observation) -> bool:
    """A Sequential model whose last module is a trainable linear head with no buffers."""
    model = obs.model
    if not isinstance(model, nn.Sequential) or len(model) < 2 or not isinstance(model[-1], nn.Linear):
        return False
    head = model[-1]
    return all(p.requires_grad for p in head.parameters()) and not any(True for _ in head.buffers())


class LowRankHeadSimulator(UpdateSimulator):
    """Drop-in `UpdateSimulator` that never materialises the intermediate head weights."""

    def __init__(self, obs: Observation, device: torch.device | str = "cpu"):
        super().__init__(obs, device)
        key = list(self.model._modules)[-1]
        self.body = self.model[:-1]  # Sequential slicing keeps the parameter names
        self.weight_name, self.bias_name = f"{key}.weight", f"{key}.bias"
        self.w0 = self.params[self.weight_name].detach()
        bias = self.params.get(self.bias_name)
        self.b0 = None if bias is None else bias.detach()
        self.body_params = {n: p for n, p in self.params.items() if n not in (self.weight_name, self.bias_name)}

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> Tensors:
        buffers = {k: v.clone() for k, v in self.buffers.items()}
        fedsgd = self.training.is_fedsgd
        step_lr = 1.0 if fedsgd else self.training.lr
        steps = [tuple(range(x.shape[0]))] if fedsgd else self.training.step_indices(x.shape[0])
        trainable = [n for n, p in self.body_params.items() if p.requires_grad]
        theta = dict(self.body_params)
        features: list[torch.Tensor] = []  # H_s of earlier steps
        errors: list[torch.Tensor] = []  # η ∂L_s/∂logits of earlier steps
        bias_shift = None  # η Σ_s ∂L_s/∂b
        body_grads: dict[str, torch.Tensor] = {}
        for idx in steps:
            index = torch.tensor(idx, device=x.device)
            h = functional_call(self.body, (theta, buffers), (x[index],))
            if h.dim() != 2:  # the head is not applied to flat features: replay normally
                return super().__call__(x, y)
            logits = h @ self.w0.T
            if self.b0 is not None:
                logits = logits + (self.b0 if bias_shift is None else self.b0 - bias_shift)
            for h_prev, e_prev in zip(features, errors):
                logits = logits - (h @ h_prev.T) @ e_prev
            loss = batch_loss(logits, y[index])
            grads = torch.autograd.grad(loss, [logits] + [theta[n] for n in trainable], create_graph=True)
            e = step_lr * grads[0]
            features.append(h)
            errors.append(e)
            bias_shift = e.sum(0) if bias_shift is None else bias_shift + e.sum(0)
            body_grads = dict(zip(trainable, grads[1:]))
            theta = {n: (p - step_lr * body_grads[n]) if n in body_grads else p for n, p in theta.items()}
        update: Tensors = {}
        for name in self.names:
            if name == self.weight_name:
                update[name] = torch.cat(errors).T @ torch.cat(features)
            elif name == self.bias_name:
                update[name] = bias_shift
            elif fedsgd:
                update[name] = body_grads[name]
            else:
                update[name] = self.body_params[name] - theta[name]
        return self.as_sent(update)


def make_simulator(obs: Observation, device: torch.device | str = "cpu") -> UpdateSimulator:
    """The low-rank replay when the model allows it, else the generic one."""
    if low_rank_head_applies(obs):
        return LowRankHeadSimulator(obs, device)
    return UpdateSimulator(obs, device)
