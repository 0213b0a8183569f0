"""Secure aggregation (Bonawitz et al. 2017): the server learns only the
aggregate of K clients' updates. The experiment computes the K-1 other
clients' updates and sums them with the target's (`aggregate_clients`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..options import check
from .base import Defense


@dataclass
class SecAggOptions:
    # K, clients in the aggregate including the target (each one a simulated update)
    clients: int = field(default=4, metadata={"range": (1, 10_000)})

    def __post_init__(self):
        check(self.clients >= 1, f"defense 'secagg': clients must be >= 1, got {self.clients}")


class SecureAggregation(Defense):
    """The server sees only the aggregate of K clients' updates."""

    name = "secagg"
    Options = SecAggOptions
    places = ()

    def __init__(self, options=None):
        super().__init__(options)
        self.aggregate_clients = self.options.clients

    def two_layer(self, view):
        parts = torch.arange(view.x.shape[0]).tensor_split(self.options.clients)

        def aggregated(x_: torch.Tensor) -> torch.Tensor:
            # With the summed loss Σ_k (B_k/B)·(B/B_k)·G_k = Σ_k G_k: one batch of size B.
            return sum(view.gradient(x_, idx) for idx in parts if len(idx))
        return view.result(aggregated)
