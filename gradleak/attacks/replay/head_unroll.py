"""Exact, faster replay of local training for Sequential models with wide linear layers.

Unrolling τ local SGD steps differentiably (`UpdateSimulator`) materialises
every linear weight W_s = W_0 − η Σ_{s'<s} E_{s'}ᵀH_{s'} at every step, where H
are the layer's inputs and E = ∂L/∂(its outputs). For ROG's settings these
weights are large — the DLG LeNet's 1000 × 12288 head, or the 512 × 65536
first linear layer of Yue et al.'s own LeNet (`lenet-rog`) at 128 px — so each
step streams 49–134 MB tensors forward and backward, and elementwise traffic,
not arithmetic, dominates the cost of an attack iteration.

The updates of a linear layer are low rank, so its outputs at step s are

    H_s W_sᵀ = H_s W_0ᵀ − η Σ_{s'<s} (H_s H_{s'}ᵀ) E_{s'},

which needs only W_0 (a constant) and small Gram products. Every top-level
trainable `nn.Linear` of a Sequential model is replayed this way; the other
layers (convolutions, pools, activations) are run functionally with their
unrolled parameters, and their gradients follow from autograd through the
linear outputs. Each linear layer's delta η Σ_s E_sᵀH_s is formed once at the
end. The result is the same update as `fl.local.local_update` with the plain
gradient, up to float rounding (tests/attacks/optimization/test_rog.py checks values and input
gradients).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from ...fl.local import batch_loss, batchnorm_mode
from ...threat import Observation
from .matching import UpdateSimulator

Tensors = dict[str, torch.Tensor]


def _low_rank_linear(module: nn.Module) -> bool:
    params = list(module.parameters())
    return (isinstance(module, nn.Linear) and bool(params) and all(p.requires_grad for p in params)
            and not any(True for _ in module.buffers()))


def low_rank_head_applies(obs: Observation) -> bool:
    """A Sequential model whose last module is a trainable linear head with no buffers, trained
    by plain SGD (the low-rank replay sums lr × gradient steps)."""
    model = obs.model
    plain = not obs.knows("local_training") or (
        (obs.update.kind == "gradient" or obs.training.plain_sgd) and obs.training.plain_loss)
    return plain and isinstance(model, nn.Sequential) and len(model) >= 2 and _low_rank_linear(model[-1])


class LowRankHeadSimulator(UpdateSimulator):
    """Drop-in `UpdateSimulator` that never materialises intermediate linear weights."""

    def __init__(self, obs: Observation, device: torch.device | str = "cpu"):
        super().__init__(obs, device)
        self.keys = list(self.model._modules)
        self.linear = {k for k in self.keys if _low_rank_linear(self.model._modules[k])}
        self.w0 = {k: self.params[f"{k}.weight"].detach() for k in self.linear}
        self.b0 = {k: self.params[f"{k}.bias"].detach() for k in self.linear if f"{k}.bias" in self.params}
        linear_names = {f"{k}.{p}" for k in self.linear for p in ("weight", "bias")}
        self.other_params = {n: p for n, p in self.params.items() if n not in linear_names}

    @staticmethod
    def _sub(tensors: Tensors, key: str) -> Tensors:
        prefix = key + "."
        return {n[len(prefix):]: t for n, t in tensors.items() if n.startswith(prefix)}

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> Tensors:
        with batchnorm_mode(self.model, self.training.batchnorm):  # as the client's local_update
            return self._replay(x, y)

    def _replay(self, x: torch.Tensor, y: torch.Tensor) -> Tensors:
        buffers = {k: v.clone() for k, v in self.buffers.items()}
        fedsgd = self.training.is_fedsgd
        step_lr = 1.0 if fedsgd else self.training.lr
        steps = [tuple(range(x.shape[0]))] if fedsgd else self.training.step_indices(x.shape[0])
        trainable = [n for n, p in self.other_params.items() if p.requires_grad]
        theta = dict(self.other_params)
        features: dict[str, list[torch.Tensor]] = {k: [] for k in self.linear}  # H_s of earlier steps
        errors: dict[str, list[torch.Tensor]] = {k: [] for k in self.linear}  # η ∂L_s/∂out of earlier steps
        bias_shift: dict[str, torch.Tensor] = {}  # η Σ_s ∂L_s/∂b
        other_grads: dict[str, torch.Tensor] = {}
        for idx in steps:
            index = torch.tensor(idx, device=x.device)
            h = x[index]
            outputs: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (key, input, output)
            for key in self.keys:
                module = self.model._modules[key]
                if key not in self.linear:
                    h = functional_call(module, (self._sub(theta, key), self._sub(buffers, key)), (h,))
                    continue
                if h.dim() != 2:  # a linear layer applied to non-flat inputs: replay normally
                    return super().__call__(x, y)
                out = h @ self.w0[key].T
                if key in self.b0:
                    out = out + (self.b0[key] - bias_shift[key] if key in bias_shift else self.b0[key])
                for h_prev, e_prev in zip(features[key], errors[key]):
                    out = out - (h @ h_prev.T) @ e_prev
                outputs.append((key, h, out))
                h = out
            loss = batch_loss(h, y[index])
            grads = torch.autograd.grad(loss, [o for _, _, o in outputs] + [theta[n] for n in trainable],
                                        create_graph=True)
            for (key, inp, _), g in zip(outputs, grads):
                e = step_lr * g
                features[key].append(inp)
                errors[key].append(e)
                bias_shift[key] = e.sum(0) if key not in bias_shift else bias_shift[key] + e.sum(0)
            other_grads = dict(zip(trainable, grads[len(outputs):]))
            theta = {n: (p - step_lr * other_grads[n]) if n in other_grads else p for n, p in theta.items()}
        update: Tensors = {}
        for name in self.names:
            key, _, kind = name.rpartition(".")
            if key in self.linear:
                if kind == "weight":
                    update[name] = torch.cat(errors[key]).T @ torch.cat(features[key])
                else:
                    update[name] = bias_shift[key]
            elif fedsgd:
                update[name] = other_grads[name]
            else:
                update[name] = self.other_params[name] - theta[name]
        return self.as_sent(update)


def make_simulator(obs: Observation, device: torch.device | str = "cpu") -> UpdateSimulator:
    """The low-rank replay when the model allows it, else the generic one."""
    if low_rank_head_applies(obs):
        return LowRankHeadSimulator(obs, device)
    return UpdateSimulator(obs, device)
