"""A binning imprint that survives local training: LOKI-style (Zhao et al., IEEE S&P 2024).

Robbing the Fed's imprint (`rtf`) assumes one gradient step: its read-out is a tiny trained
layer, so over several local steps with momentum and weight decay its columns drift apart, each
bin's back-propagated signal differs, the differences of cumulative bins no longer cancel, and
the bins' tiny bias updates fall below float32's resolution. LOKI keeps an imprint layer
decodable under FedAvg with several local iterations. This attack keeps its goal (many bins on
one query, each sample alone in its bin read from the update) and gets there with three
choices of our own, measured in docs/analytic-attacks.md:

- **Twin read-outs that cancel.** The block is  x → x + R₊·ReLU(Wx + b) + R₋·ReLU(Wx + b)  with
  two identical banks of K bins and read-outs R₊ = r·u·1ᵀ, R₋ = −r·u·1ᵀ: the forward pass adds
  exactly nothing, so the client trains the server's model as if unmodified, while every bin
  receives the back-propagated signal ±r·uᵀ∂L/∂x of a sample. The read-outs are a fixed part of
  the architecture (a buffer): trained, they drift together and stop cancelling.
- **The read-out sized to the model** (`readout_size`): r = `gain` over the model's typical
  per-example input gradient, so that the signal clears float32's rounding without feeding the
  banks' own updates back into the input.
- **Read from the update's differences.** Bank rows share one query v, so weight decay and the
  momentum's per-step factors act alike on every row and cancel in the difference of
  consecutive bins, which leaves c·(x, 1) for the one sample between two thresholds: x = Δw/Δb,
  wherever the thresholds moved during the round (the lowest bin, whose bias sits far out,
  takes its scale from the query instead).

Bins: K thresholds at quantiles of the query's distribution (prior data when granted, else the
server's assumed normal, as in `rtf`). A client's examples in one round (not one batch) share
the K bins, so K is a few times the examples per round: 4,096 for the Flower example's 400.
Through secure aggregation (`clients` = the group's size): LOKI keeps the clients apart with
client-specific convolution kernels; here each client of the group gets its own block of bins
(`client_model`: the other blocks have no weights and a bias below zero), so the aggregate's
block 0 holds the attacked client's examples alone, and the other clients' weight decay, the
same on every row of a block, cancels in the differences. The model grows with the group
(2·K·clients rows).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ...errors import GradleakError
from ...options import check
from ...threat import Observation
from ..base import Attack, AttackContext, PreparedModel, Reconstruction
from ..replay.labels import recover_labels
from .rtf import query_thresholds

IMPRINT = "imprint"


@dataclass
class LokiOptions:
    bins: int = field(default=4096, metadata={"range": (2, 65536)})  # K per bank: a few times the examples per round
    query: Literal["mean", "gaussian"] = "mean"  # mean brightness, or a random Gaussian direction
    calibration: Literal["auto", "prior", "assumed"] = "auto"  # auto = prior if granted
    assumed_mean: float = 0.15  # query distribution assumed without prior data
    assumed_std: float = 0.06
    # clients in the secure-aggregation group: one block of 2K bins each
    clients: int = field(default=1, metadata={"range": (1, 1000)})
    # r, each bank's read-out size: `gain` over the model's typical per-example input gradient
    # (measured by the server on its own model, `readout_size`), or this size when > 0
    readout: float = field(default=0.0, metadata={"range": (0.0, 1e9)})
    gain: float = field(default=0.007, metadata={"range": (1e-9, 1e3)})
    # a bin whose weight difference is below this fraction of the largest counts as empty
    min_difference: float = field(default=1e-3, metadata={"range": (0.0, 1.0)})

    def __post_init__(self):
        check(self.bins >= 2, "attack 'loki': bins must be >= 2")
        check(self.assumed_std > 0, "attack 'loki': assumed_std must be > 0")
        check(self.readout >= 0, "attack 'loki': readout must be >= 0 (0: from gain)")
        check(self.gain > 0, "attack 'loki': gain must be > 0")
        check(self.clients >= 1, "attack 'loki': clients must be >= 1")


# Another client's bins: no weights and a bias below zero, so they stay at zero without a
# gradient. Small on purpose: a far-out bias decays by a large amount each step, and summed with
# the attacked client's update by secure aggregation it would round that update's bins away.
OUT_OF_REACH = 1.0


class TwinImprintedModel(nn.Module):
    """Per client of the group, two identical banks of K bins in front of the original model,
    with read-outs that cancel; the blocks of the other clients are out of reach."""

    def __init__(self, inner: nn.Module, query: torch.Tensor, thresholds: torch.Tensor, readout: float,
                 generator: torch.Generator, clients: int = 1):
        super().__init__()
        d, k = query.numel(), thresholds.numel()
        self.imprint = nn.Linear(d, 2 * k * clients)
        self.thresholds, self.query = thresholds, query
        with torch.no_grad():
            direction = torch.randn(d, 1, generator=generator)
            column = readout * direction / direction.norm()
            # a fixed part of the architecture (a buffer, not trained): trained read-outs drift
            # together, stop cancelling, and feed the bins back into the input until training diverges
            self.register_buffer("readout", torch.cat([column.expand(d, k), -column.expand(d, k)] * clients, 1))
        self.live(0)
        self.inner = inner

    def live(self, client: int) -> "TwinImprintedModel":
        """Bins in reach for `client`'s block only."""
        k2 = 2 * self.thresholds.numel()
        block = slice(client * k2, (client + 1) * k2)
        with torch.no_grad():
            self.imprint.weight.zero_()
            self.imprint.weight[block] = self.query.reshape(1, -1)
            self.imprint.bias.fill_(-OUT_OF_REACH)
            self.imprint.bias[block] = -torch.cat([self.thresholds, self.thresholds])
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        bins = torch.relu(self.imprint(flat))
        return self.inner((flat + bins @ self.readout.T).view_as(x))


@dataclass(frozen=True)
class LokiSecrets:
    """What the server keeps: the query and the bins' thresholds, ascending (the first one as
    calibrated; the model's lowest bin starts at −∞ so that every sample lands in a bin)."""

    query: torch.Tensor
    thresholds: torch.Tensor


def decode_bins(weight_update: torch.Tensor, bias_update: torch.Tensor, secrets: LokiSecrets,
                min_difference: float) -> torch.Tensor:
    """The samples alone in their bins, from the imprint's update (2K rows per client: the +
    bank, then the − bank; a gradient or a delta, either sign)."""
    k = secrets.thresholds.numel()

    def differences(rows: torch.Tensor) -> torch.Tensor:
        # the − bank's signal is the + bank's negated: their difference doubles it, and averages
        # the rounding of the two; block 0 is the attacked client's
        bank = rows[:k] - rows[k:2 * k]
        return bank - torch.cat([bank[1:], torch.zeros_like(bank[:1])])

    d_w, d_b = differences(weight_update.double()), differences(bias_update.double()[:, None])[:, 0]
    size = d_w.norm(dim=1)
    occupied = size > min_difference * size.max().clamp_min(1e-300)
    d_w, d_b = d_w[occupied], d_b[occupied]
    # x = Δw / Δb for the one sample between two thresholds, wherever the thresholds moved over
    # the round. The lowest bin's bias sits far out, so weight decay swamps its Δb: its scale
    # comes from the query instead (v·x lies below the first threshold as calibrated).
    along = d_w @ secrets.query.double()
    from_query = secrets.thresholds.double()[0] / along.where(along.abs() > 0, torch.ones_like(along))
    scale = torch.where(torch.arange(k)[occupied] == 0, from_query, 1.0 / d_b.where(d_b != 0, torch.ones_like(d_b)))
    return (d_w * scale[:, None]).float()


def readout_size(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, gain: float, prior_data,
                 generator: torch.Generator) -> float:
    """The read-out r that gives a sample's bins the signal r·‖∂L/∂x‖ ≈ gain: too small and float32
    rounds the bins' updates away, too large and the bins' own updates feed back into the input
    over the round. The server measures the typical per-example input gradient of the model it
    sends on inputs of its own (prior examples when granted, else uniform noise; within 25% of the
    real data's for the models measured, docs/analytic-attacks.md), with random labels."""
    if prior_data is not None:
        x = prior_data.inputs[:64].float().clone()
    else:
        x = torch.rand(64, *input_shape, generator=generator)
    y = torch.randint(0, num_classes, (x.shape[0],), generator=generator)
    x.requires_grad_(True)
    was_training = model.training
    model.eval()
    try:
        loss = nn.functional.cross_entropy(model(x), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x)
    finally:
        model.train(was_training)
    typical = float(grad.flatten(1).norm(dim=1).median())
    if not math.isfinite(typical) or typical <= 0:
        raise GradleakError("attack 'loki': the model's output does not depend on its input")
    return gain / typical


class Loki(Attack):
    """A twin-bank imprint whose bins stay decodable over the client's local steps."""

    name = "loki"
    Options = LokiOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"prior_data", "labels"})
    malicious = True

    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> PreparedModel:
        opt = self.options
        gen = ctx.generator(101)
        query, thresholds = query_thresholds(opt, math.prod(input_shape), ctx.prior_data, gen, self.name)
        sent = thresholds.clone()
        sent[0] = sent[0] - 1e3  # the lowest bin holds everything below it
        readout = opt.readout or readout_size(model, input_shape, num_classes, opt.gain, ctx.prior_data,
                                              ctx.generator(103))
        crafted = TwinImprintedModel(model, query, sent.float(), readout, gen, opt.clients)
        return PreparedModel(crafted, LokiSecrets(query=query, thresholds=thresholds))

    def client_model(self, prepared: PreparedModel, client: int) -> nn.Module:
        if client == 0 or not isinstance(prepared.model, TwinImprintedModel):
            return prepared.model
        if client >= self.options.clients:
            raise GradleakError(f"attack 'loki': a secure-aggregation group of more than clients="
                                f"{self.options.clients} (set loki:clients to the group's size)")
        return copy.deepcopy(prepared.model).live(client)

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        secrets = obs.server_secrets
        weight, bias = obs.update.tensors.get(f"{IMPRINT}.weight"), obs.update.tensors.get(f"{IMPRINT}.bias")
        if weight is None or bias is None or not isinstance(secrets, LokiSecrets):
            raise GradleakError("attack 'loki': the model has no imprint block (run it with --threat malicious "
                                "so the server can send its modified model)")
        x = decode_bins(weight, bias, secrets, self.options.min_difference).reshape(-1, *obs.input_shape)
        x = obs.kind.clamp(x)
        labels = recover_labels(obs, "auto", ctx.generator(17))
        return Reconstruction(inputs=x, labels=labels, extras={"occupied_bins": int(x.shape[0])})
