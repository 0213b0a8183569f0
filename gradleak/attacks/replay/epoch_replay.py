"""An order-free, batched replay of many local epochs of plain SGD.

A client that trains E epochs of k mini-batches in an order the server does not know
takes E·k sequential steps; replaying them exactly (`UpdateSimulator` over the fedavg
attack's per-epoch copies) costs E·k small forward/backward/double-backward passes per
attack iteration, which on Dimitrov et al.'s setting (10 epochs × 10 mini-batches of 5) kept
500 iterations beyond 450 s even on an H200.

With plain SGD at the small learning rates FedAvg clients use, the order only enters at
second order in the learning rate: within an epoch the k mini-batches' mean gradients sum to
k times the whole batch's mean gradient evaluated at the epoch's starting weights, plus
terms of order η · k · ‖H‖ · ‖g‖ that depend on the order. This replay therefore takes one
step per epoch over the whole batch, with the step scaled by the epoch's mini-batch count:

    θ_{e+1} = θ_e − η · k_e · ∇ mean-loss(θ_e; all examples),   update = θ_0 − θ_E.

That is E full-batch passes instead of E·k mini-batch passes (the same examples seen, ~k
times fewer sequential kernels), one reconstruction per example (no per-epoch copies to
register), and only the label multiset matters (no arrangement of labels over mini-batches).
It is exact when every step sees the whole batch (k = 1). The attack's "auto" chooses it
where it applies (`applies`: plain SGD, plain loss, no augmentation, order unknown, at least
MIN_STEPS steps) and where the order's share of the update, which the server estimates on
random inputs (`order_share`), is small under the attack's distance: one epoch's steps can
move a model's weights too far for the order to be second order (docs/client-training.md).
"""
from __future__ import annotations

import math

import torch

from ...fl.local import batchnorm_mode, loss_gradient
from ...fl.training import TrainingSpec
from ...threat import Observation
from .matching import Distance, Tensors, UpdateSimulator, update_distance

# Below this many local steps "auto" keeps the exact replay on per-epoch copies, whose cost
# grows with the steps: at a few steps it is affordable and fits the update exactly
# (docs/client-training.md)
MIN_STEPS = 16


def plain_training(training: TrainingSpec) -> bool:
    """Local training this replay simulates: plain SGD on the plain loss, several steps, no
    augmentation (whose draws would differ per step)."""
    return not training.is_fedsgd and training.plain_sgd and training.plain_loss and not training.augment


def applies(training: TrainingSpec, samples: int) -> bool:
    """Where the attack's "auto" takes the order-free replay: plain training (above) over
    at least MIN_STEPS mini-batch steps whose order the server cannot replay."""
    return (plain_training(training) and training.order == "unknown"
            and training.step_batch_size(samples) < samples and training.num_steps(samples) >= MIN_STEPS)


def epoch_step_counts(training: TrainingSpec, samples: int) -> list[int]:
    """The mini-batch count of every epoch the client trained (the last one partial when the
    client counted steps rather than epochs)."""
    per_epoch = math.ceil(samples / training.step_batch_size(samples))
    total = training.num_steps(samples)
    return [min(per_epoch, total - start) for start in range(0, total, per_epoch)]


# "auto" keeps the epoch replay only where its `order_share` is at most this: below it in
# the settings where the replay models the update well, above it where it does not
# (docs/client-training.md has the measured shares)
MAX_ORDER_SHARE = 0.15


def order_share(obs: Observation, labels: torch.Tensor, distance: Distance, generator: torch.Generator,
                device: torch.device | str = "cpu") -> float:
    """How much of the update the order decides, as the server can tell without the data: the
    distance from the epoch replay to the exact training in a random order (random inputs of
    the recovered labels), over the distance between the replays of two random batches."""
    samples, training = obs.batch_size, obs.training
    batch = training.step_batch_size(samples)
    steps: list[tuple[int, ...]] = []
    for count in epoch_step_counts(training, samples):
        order = torch.randperm(samples, generator=generator).tolist()
        steps += [tuple(order[i:i + batch]) for i in range(0, samples, batch)][:count]
    shape = (samples, *obs.input_shape)
    x = torch.rand(shape, generator=generator).to(device)
    other = torch.rand(shape, generator=generator).to(device)
    y = labels.to(device)
    exact = {n: t.detach() for n, t in UpdateSimulator(obs, device, steps=steps)(x, y).items()}
    replay = EpochReplay(obs, device)
    near = float(update_distance(replay(x, y), exact, distance).detach())
    far = float(update_distance(replay(other, y), exact, distance).detach())
    return near / far if far > 0 else float("inf")


class EpochReplay(UpdateSimulator):
    """Candidate batch → the update of `epoch_step_counts` full-batch SGD steps (module doc)."""

    def __init__(self, obs: Observation, device: torch.device | str = "cpu"):
        super().__init__(obs, device)
        self.counts = epoch_step_counts(self.training, obs.batch_size)
        self.gradient = loss_gradient(self.training.label_smoothing)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> Tensors:
        buffers = {k: v.clone() for k, v in self.buffers.items()}
        if self.cheap_double_backward and x.grad_fn is None:
            x = x.view_as(x)  # lets the first layer skip its unused input gradient (double_backward)
        lr = self.training.lr
        current = dict(self.params)
        with batchnorm_mode(self.model, self.training.batchnorm):
            for count in self.counts:
                grads = self.gradient(self.model, current, buffers, x, y, True)
                current = {n: p - (lr * count) * grads[n] if n in grads else p for n, p in current.items()}
        return self.as_sent({n: self.params[n] - current[n] for n in self.names})
