"""One client's round: local training with the defense chain applied where a
real deployment applies each defense (data, per-step gradient, final update)."""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..modalities import modality as modality_of
from .buffers import Tensors, sent_buffers
from .local import StepGradient, local_update, loss_gradient, model_state
from .places import DefenseContext, NoDefense
from .training import TrainingSpec
from .update import Update


def compute_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, training: TrainingSpec,
                   defenses=None, generator: torch.Generator | None = None,
                   client_state: dict | None = None, modality: str | None = None) -> Update:
    """What the client sends after training on (x, y).

    `defenses` is a `gradleak.defenses.DefenseChain` (or None): anything with the
    hooks of `gradleak.fl.places.NoDefense`. `client_state` persists across rounds
    for defenses with memory (DGC's residuals). `modality` names the data's, which decides
    how the training's augmentation acts on it (without one: what the tensors declare).
    """
    chain = defenses if defenses is not None else NoDefense()
    ctx = DefenseContext(generator=generator or torch.Generator().manual_seed(0),
                         state=client_state if client_state is not None else {},
                         training=training, model=model)
    x, y = chain.transform_batch(x, y, ctx)
    params, buffers = model_state(model)
    step_gradient = chain.step_gradient(loss_gradient(training.label_smoothing), ctx)
    running = {n: b.clone() for n, b in buffers.items()}  # the buffers the client sends, if it does
    if training.sends_buffers and training.batchnorm == "train":
        step_gradient = updating_running_statistics(step_gradient, running)
    if training.order == "unknown" and training.shuffle_seed is None:
        # the client's own shuffling seed, which the server never learns
        training = dataclasses.replace(
            training, shuffle_seed=int(torch.randint(0, 2**31 - 1, (), generator=ctx.generator)))
    kind, tensors = local_update(model, params, buffers, x, y, training, step_gradient=step_gradient,
                                 augment_generator=ctx.generator,
                                 modality=modality_of(modality) if modality is not None else None)
    update = Update(
        tensors={k: v.detach() for k, v in tensors.items()},
        kind=kind,
        lr=training.lr,
        steps=training.num_steps(x.shape[0]),
        batch_size=training.step_batch_size(x.shape[0]),
        samples=int(x.shape[0]),
        epochs=training.local_epochs,
        buffers=sent_buffers(model, running) if training.sends_buffers else {},
    )
    update = chain.transform_update(update, ctx)  # defenses act on the tensors; buffers travel as sent
    update.check_finite()
    return update


def updating_running_statistics(inner: StepGradient, running: Tensors) -> StepGradient:
    """`inner`, and at each local step the buffers in `running` updated as PyTorch's batch
    norm updates a model's in a train-mode forward pass: once, from the step's batch at the
    step's weights. `inner` gets a copy of the buffers, so that a defense's extra forward
    passes do not count as steps; the extra forward pass that updates `running`
    draws the random numbers (dropout masks, PRECODE's noise) the gradient's own pass drew,
    and leaves every generator where that pass left it, so the update is unchanged."""
    from torch.func import functional_call

    def step(model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor,
             create_graph: bool) -> Tensors:
        generators = module_generators(model)
        global_state, own_states = torch.get_rng_state(), [g.get_state() for g in generators]
        grads = inner(model, params, {n: b.clone() for n, b in buffers.items()}, x, y, create_graph)
        after = [g.get_state() for g in generators]
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.set_rng_state(global_state)
            for generator, state in zip(generators, own_states):
                generator.set_state(state)
            functional_call(model, ({n: p.detach() for n, p in params.items()}, running), (x,))
        for generator, state in zip(generators, after):
            generator.set_state(state)
        return grads

    return step


def module_generators(model: nn.Module) -> list[torch.Generator]:
    """The random generators a model's layers keep of their own (seeded dropout, PRECODE)."""
    return [value for module in model.modules() for value in vars(module).values()
            if isinstance(value, torch.Generator)]


def aggregate_updates(updates: list[Update]) -> Update:
    """Sample-weighted average, as FedAvg (and secure aggregation) computes it:
    the server learns only this sum, not who contributed what."""
    if not updates:
        raise ValueError("no updates to aggregate")
    total = sum(u.samples for u in updates)
    tensors = {name: sum(u.tensors[name] * (u.samples / total) for u in updates)
               for name in updates[0].tensors}
    first = updates[0]
    return first.replace(tensors=tensors, samples=total, clients=sum(u.clients for u in updates),
                         buffers=aggregate_buffers(updates, total))


def aggregate_buffers(updates: list[Update], total: int) -> dict[str, torch.Tensor]:
    """The clients' buffers averaged as FedAvg averages a state dict (sample-weighted; counts
    such as num_batches_tracked rounded); none unless every client sent them."""
    if not all(u.buffers for u in updates):
        return {}
    out = {}
    for name, tensor in updates[0].buffers.items():
        mean = torch.stack([u.buffers[name].double() * (u.samples / total) for u in updates]).sum(0)
        out[name] = (mean if tensor.is_floating_point() else mean.round()).to(tensor.dtype)
    return out
