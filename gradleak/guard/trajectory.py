"""An honest FedAvg federation simulated with gradleak's own client (`gradleak.fl`): the
global models a client receives round after round, and each client's own update. The
guard's false-alarm rate is measured on these trajectories (instead of running Flower for
20 rounds): every client trains as `compute_update` replays the app's training (the Flower
example's captured updates match it to float rounding, benchmarks/bench_flower.py), and the
server averages the returned models weighted by their examples, as Flower's FedAvg does.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from ..fl import TrainingSpec, compute_update
from ..fl.update import Update


@dataclass
class Round:
    """What the clients received in one round and what each sent back."""

    number: int  # 1-based, as Flower counts server rounds
    received: dict[str, torch.Tensor]  # the global state sent to every client
    updates: list[Update]  # each client's update (received - returned, per parameter)


def honest_fedavg(model: nn.Module, clients: Sequence[tuple[torch.Tensor, torch.Tensor]],
                  training: Callable[[int, int], TrainingSpec], rounds: int) -> list[Round]:
    """`rounds` rounds of FedAvg from `model`'s weights; `training(round, client)` is the
    client's training in that round (its shuffling seed)."""
    global_model = copy.deepcopy(model)
    history = []
    for number in range(1, rounds + 1):
        received = {k: v.detach().clone() for k, v in global_model.state_dict().items()}
        updates = []
        for index, (x, y) in enumerate(clients):
            local = copy.deepcopy(global_model)
            updates.append(compute_update(local, x, y, training(number, index)))
        history.append(Round(number, received, updates))
        total = sum(u.samples for u in updates)
        with torch.no_grad():
            for name, p in global_model.named_parameters():
                if name in updates[0].tensors:
                    p -= sum(u.tensors[name] * (u.samples / total) for u in updates)
    return history
