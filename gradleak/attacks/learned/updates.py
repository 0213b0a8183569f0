"""The learned inverter's training data: the updates the client would send for auxiliary images.

The server knows the protocol: the model it sent, the client's training and its defenses
with their parameters. It plays the client on auxiliary images (the pool the attack picks:
held-out examples when the threat model grants `prior_data`, else crops of public photographs,
`gradleak.data.auxiliary`, with random labels), running the very training and defense chain
the client runs (`compute_update`). Each resulting update enters as a fixed count
sketch (a sparse random projection: each entry added, with a random sign, to one of `sketch`
buckets), so that large models fit; its images are kept sorted by label, the order in which
the attack recovers the labels.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ...fl import aggregate_updates, compute_update
from ...seeding import stream
from ...threat import Observation


class UpdateSketch:
    """A count sketch of flattened updates: entry j goes, times sign_j, to bucket h(j). Linear,
    O(parameters) memory, and fixed by its seed, so the server sketches the observed update as it
    sketched the training ones."""

    def __init__(self, entries: int, buckets: int, seed: int):
        self.entries = entries
        self.buckets = min(buckets, entries)
        generator = stream(seed, "learned", "sketch")
        if self.buckets == entries:  # small update: every entry is its own bucket, nothing mixed
            self.index = torch.arange(entries)
            self.sign = torch.ones(entries)
        else:
            self.index = torch.randint(self.buckets, (entries,), generator=generator)
            self.sign = torch.randint(2, (entries,), generator=generator).float() * 2 - 1

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(flat.shape[0], self.buckets, dtype=flat.dtype)
        return out.index_add_(1, self.index, flat * self.sign)


@dataclass
class AuxiliaryUpdates:
    features: torch.Tensor  # (N, buckets): the sketched updates
    images: torch.Tensor  # (N, slots, *image_shape)
    labels: torch.Tensor  # (N, slots), in the order the attack recovers them (sorted)
    seconds: float


def _sorted_by_label(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.sort(labels, stable=True).indices
    return images[order], labels[order]


def auxiliary_updates(obs: Observation, pool_inputs: torch.Tensor, pool_labels: torch.Tensor | None,
                      samples: int, sketch: UpdateSketch, seed: int,
                      device: torch.device | None = None) -> AuxiliaryUpdates:
    """`samples` updates the client would send for batches drawn from the pool, through its
    training and defense chain (secure aggregation: every client of the sum drawn from the pool).
    Without pool labels (public photos) each example gets a uniform random label. `device`
    computes the batched FedSGD gradients (the bulk of the work) there; the defenses and the
    client's own loop run where the observed model lives."""
    from ...defenses import DefenseChain

    start = time.perf_counter()
    chain = DefenseChain(list(obs.get("defenses")))
    clients = chain.aggregate_clients
    per_client = obs.batch_size // clients
    draw = stream(seed, "learned", "batches")
    picks = torch.randint(len(pool_inputs), (samples, clients, per_client), generator=draw)
    inputs = pool_inputs[picks]  # (samples, clients, per_client, *shape)
    labels = pool_labels[picks] if pool_labels is not None else \
        torch.randint(obs.num_classes, (samples, clients, per_client), generator=draw)
    sent = client_updates(obs, chain, inputs.flatten(0, 1), labels.flatten(0, 1), seed, device)
    features, images, slot_labels = [], [], []
    for i in range(samples):  # updates are sketched as they come: only a chunk is held at a time
        mine = [next(sent) for _ in range(clients)]
        update = aggregate_updates(mine) if clients > 1 else mine[0]
        x, y = _sorted_by_label(inputs[i].flatten(0, 1), labels[i].flatten(0, 1))
        features.append(sketch(update.flat()[None].float())[0])
        images.append(x)
        slot_labels.append(y)
    return AuxiliaryUpdates(torch.stack(features), torch.stack(images), torch.stack(slot_labels),
                            time.perf_counter() - start)


def client_updates(obs: Observation, chain, inputs: torch.Tensor, labels: torch.Tensor, seed: int,
                    device: torch.device | None = None) -> Iterator:
    """The update of each client `i` training on (inputs[i], labels[i]), in order, as
    `compute_update` sends it. One FedSGD step of the plain loss, defended only at the update,
    is every client's mean per-example gradient (torch.func, many clients per pass) with the
    defenses applied after it; anything else runs the client's own loop."""
    clients = [stream(seed, "learned", "client", i) for i in range(len(inputs))]
    first = compute_update(obs.model, inputs[0], labels[0], obs.training, chain, clients[0],
                           modality=obs.modality)
    yield first
    if not _one_plain_step(obs, chain):
        for i in range(1, len(inputs)):
            yield compute_update(obs.model, inputs[i], labels[i], obs.training, chain, clients[i],
                                 modality=obs.modality)
        return
    from ...fl.local import batchnorm_mode
    from ...fl.places import DefenseContext

    template = first if not len(chain) else compute_update(obs.model, inputs[0], labels[0], obs.training)
    with batchnorm_mode(obs.model, obs.training.batchnorm):  # as the client's step: running statistics
        for start, gradients in _mean_per_example_gradients(obs.model, inputs[1:], labels[1:], device):
            for j in range(len(next(iter(gradients.values())))):
                update = template.replace(tensors={n: gradients[n][j] for n in template.tensors})
                i = 1 + start + j
                yield chain.transform_update(update, DefenseContext(clients[i], {}, obs.training, obs.model))


def _one_plain_step(obs: Observation, chain) -> bool:
    from ...fl.buffers import batchnorm_layers

    training = obs.training
    active_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) and m.training for m in obs.model.modules())
    batch_statistics = training.batchnorm == "train" and bool(batchnorm_layers(obs.model))
    return (training.is_fedsgd and training.plain_loss and not training.augment and not active_dropout
            and not batch_statistics and all(set(d.places) == {"update"} for d in chain))


def _mean_per_example_gradients(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                                device: torch.device | None = None) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """(first client, each client's mean-loss gradient) chunk by chunk (clients × batch examples,
    DP-SGD's per-example gradients, about 512 MB at a time), computed on `device` (default: the
    model's) and returned where the model lives."""
    from ...defenses.dpsgd import per_example_gradients
    from ...fl.local import model_state

    home = next(model.parameters()).device
    device = device or home
    params, buffers = model_state(model)
    if device != home:
        params = {n: p.detach().to(device).requires_grad_(p.requires_grad) for n, p in params.items()}
        buffers = {n: b.to(device) for n, b in buffers.items()}
    clients, batch = labels.shape
    entries = sum(p.numel() for p in params.values() if p.requires_grad)
    chunk = max(1, (2 ** 27 // entries) // batch)  # clients per pass
    for start in range(0, clients, chunk):
        x = inputs[start:start + chunk].flatten(0, 1).to(device)
        y = labels[start:start + chunk].flatten(0, 1).to(device)
        yield start, {name: g.detach().view(-1, batch, *g.shape[1:]).mean(1).to(home)
                      for name, g in per_example_gradients(model, params, buffers, x, y).items()}
