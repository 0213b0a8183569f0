"""PRECODE (Scheliga et al., WACV 2022): a variational bottleneck in front of
the classifier head, trained with a KL(N(μ,σ²) ‖ N(0,1)) regulariser.

The model both sides see gains encoder (features → 2k), reparameterised
sampling z = μ + σ·ε and decoder (k → features); the client's local loss adds
beta·KL. The client's sampling noise ε is private: drawn from the client's stream each step.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from ..fl.local import batch_loss
from ..models import last_linear
from ..options import MAX_PARAMETERS, check, check_size
from .base import Defense, DefenseContext
from .dropout import insert_before_classifier


@dataclass
class PrecodeOptions:
    bottleneck: int = 256  # k, latent size of the variational bottleneck
    beta: float = 1e-3  # weight of the KL term in the local loss
    seed: int = 0  # seed of the bottleneck's initialisation (ε comes from the client's stream)

    def __post_init__(self):
        check(self.bottleneck >= 1, f"defense 'precode': bottleneck must be >= 1, got {self.bottleneck}")
        check(self.beta >= 0, f"defense 'precode': beta must be >= 0, got {self.beta}")


class VariationalBottleneck(nn.Module):
    def __init__(self, features: int, latent: int, seed: int):
        super().__init__()
        # encoder (features -> 2k) and decoder (k -> features): refuse before allocating
        check_size(f"defense 'precode' with bottleneck={latent} on {features} features",
                   3 * features * latent + 3 * latent + features, MAX_PARAMETERS, "parameters")
        init = torch.random.fork_rng()
        with init:
            torch.manual_seed(seed)
            self.encoder = nn.Linear(features, 2 * latent)
            self.decoder = nn.Linear(latent, features)
        self.latent = latent
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.kl: torch.Tensor | None = None  # KL of the last forward pass (read by the client's loss)

    def __deepcopy__(self, memo):
        # The last pass's KL is part of an autograd graph, which cannot be copied; a copy
        # of the model starts without one.
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            clone.__dict__[key] = None if key == "kl" else copy.deepcopy(value, memo)
        return clone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, log_var = self.encoder(x).split(self.latent, dim=-1)
        std = torch.exp(0.5 * log_var)
        self.kl = 0.5 * (mu.pow(2) + std.pow(2) - log_var - 1).sum(-1).mean()
        if self.training:
            z = mu + std * torch.randn(mu.shape, generator=self.generator).to(mu)
        else:
            z = mu
        return self.decoder(z)


class Precode(Defense):
    """Variational bottleneck before the classifier, KL-regularised local loss."""

    name = "precode"
    Options = PrecodeOptions
    places = ("model", "gradient")

    def transform_model(self, model: nn.Module) -> nn.Module:
        _, head = last_linear(model)
        opt = self.options
        return insert_before_classifier(model, VariationalBottleneck(head.in_features, opt.bottleneck, opt.seed))

    def wrap_step_gradient(self, inner, ctx: DefenseContext):
        beta = self.options.beta

        def regularised(model, params, buffers, x, y, create_graph):
            bottlenecks = [m for m in model.modules() if isinstance(m, VariationalBottleneck)]
            if not bottlenecks:
                return inner(model, params, buffers, x, y, create_graph)
            for bottleneck in bottlenecks:  # ε from the client's stream: one update per stream
                bottleneck.generator = torch.Generator().manual_seed(
                    int(torch.randint(0, 2**62, (), generator=ctx.generator)))
            logits = functional_call(model, (params, buffers), (x,))
            loss = batch_loss(logits, y, ctx.label_smoothing) + beta * sum(b.kl for b in bottlenecks)
            names = [n for n, p in params.items() if p.requires_grad]
            grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=create_graph)
            return dict(zip(names, grads))

        return regularised
