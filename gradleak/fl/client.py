"""One client's round: local training with the defense chain applied where a
real deployment applies each defense (data, per-step gradient, final update)."""
from __future__ import annotations

import torch
from torch import nn

from .local import local_update, model_state, plain_gradient
from .places import DefenseContext, NoDefense
from .training import TrainingSpec
from .update import Update


def compute_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, training: TrainingSpec,
                   defenses=None, generator: torch.Generator | None = None,
                   client_state: dict | None = None) -> Update:
    """What the client sends after training on (x, y).

    `defenses` is a `gradleak.defenses.DefenseChain` (or None): anything with the
    hooks of `gradleak.fl.places.NoDefense`. `client_state` persists across rounds
    for defenses with memory (DGC's residuals).
    """
    chain = defenses if defenses is not None else NoDefense()
    ctx = DefenseContext(generator=generator or torch.Generator().manual_seed(0),
                         state=client_state if client_state is not None else {},
                         training=training, model=model)
    x, y = chain.transform_batch(x, y, ctx)
    params, buffers = model_state(model)
    step_gradient = chain.step_gradient(plain_gradient, ctx)
    kind, tensors = local_update(model, params, buffers, x, y, training, step_gradient=step_gradient)
    update = Update(
        tensors={k: v.detach() for k, v in tensors.items()},
        kind=kind,
        lr=training.lr,
        steps=training.num_steps(x.shape[0]),
        batch_size=training.step_batch_size(x.shape[0]),
        samples=int(x.shape[0]),
        epochs=training.local_epochs,
    )
    update = chain.transform_update(update, ctx)
    update.check_finite()
    return update


def aggregate_updates(updates: list[Update]) -> Update:
    """Sample-weighted average, as FedAvg (and secure aggregation) computes it:
    the server learns only this sum, not who contributed what."""
    if not updates:
        raise ValueError("no updates to aggregate")
    total = sum(u.samples for u in updates)
    tensors = {name: sum(u.tensors[name] * (u.samples / total) for u in updates)
               for name in updates[0].tensors}
    first = updates[0]
    return first.replace(tensors=tensors, samples=total, clients=sum(u.clients for u in updates))
