"""An honest FedAvg federation simulated with gradleak's own client (`gradleak.fl`): the
global models a client receives round after round, and each client's own update. The
guard's false-alarm rate is measured on these trajectories (instead of running Flower for
20 rounds): every client trains as `compute_update` replays the app's training (the Flower
example's captured updates match it to float rounding, benchmarks/pipeline/bench_flower.py), and the
server averages the returned models weighted by their examples, as Flower's FedAvg does.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from ..fl import TrainingSpec, compute_update
from ..fl.update import Update


@dataclass
class Round:
    """What the clients received in one round and what each sent back."""

    number: int  # 1-based, as Flower counts server rounds
    received: dict[str, torch.Tensor]  # the global state sent to every client
    updates: dict[int, Update]  # the kept clients' updates (received - returned, per parameter)


# (round, client, the model it received, its update, its examples, labels) -> what it sends
# (None: nothing)
Send = Callable[[int, int, nn.Module, Update, torch.Tensor, torch.Tensor], "Update | None"]


def honest_fedavg(model: nn.Module, clients: Sequence[tuple[torch.Tensor, torch.Tensor]],
                  training: Callable[[int, int], TrainingSpec], rounds: int,
                  keep: Sequence[int] | None = None, send: Send | None = None,
                  final: bool = False) -> Iterator[Round]:
    """`rounds` rounds of FedAvg from `model`'s weights, one `Round` at a time;
    `training(round, client)` is the client's training in that round (its shuffling seed);
    `keep`: the clients whose updates each Round holds (None: all); `send`: what a client
    sends instead of its update (a guard, a fixed defense); the server averages what it
    receives, weighted by examples, and keeps its model when it receives nothing. `final`:
    one more Round (number `rounds + 1`, no updates) holding the model the last round made."""
    global_model = copy.deepcopy(model)
    for number in range(1, rounds + 1):
        received = {k: v.detach().clone() for k, v in global_model.state_dict().items()}
        sent_updates = []
        kept = {}
        for index, (x, y) in enumerate(clients):
            update = compute_update(copy.deepcopy(global_model), x, y, training(number, index))
            if keep is None or index in keep:
                kept[index] = update
            if send is not None:
                update = send(number, index, copy.deepcopy(global_model), update, x, y)
            if update is not None:
                sent_updates.append(update)
        yield Round(number, received, kept)
        total = sum(u.samples for u in sent_updates)
        step = {name: sum(u.tensors[name] * (u.samples / total) for u in sent_updates)
                for name in (sent_updates[0].tensors if sent_updates else {})}
        with torch.no_grad():
            for name, p in global_model.named_parameters():
                if name in step:
                    p -= step[name]
    if final:
        yield Round(rounds + 1, {k: v.detach().clone() for k, v in global_model.state_dict().items()}, {})
