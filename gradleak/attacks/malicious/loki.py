"""A binning imprint that survives local training: LOKI-style (Zhao et al., IEEE S&P 2024).

Robbing the Fed's imprint (`rtf`) assumes one gradient step: its read-out is a tiny trained
layer, so over several local steps with momentum and weight decay its columns drift apart, each
bin's back-propagated signal differs, the differences of cumulative bins no longer cancel, and
the bins' tiny bias updates fall below float32's resolution. LOKI keeps an imprint layer
decodable under FedAvg with several local iterations. This attack keeps its goal (many bins on
one query, each sample alone in its bin read from the weight update) and gets there with two
choices of our own, measured in docs/analytic-attacks.md:

- **Twin read-outs that cancel.** The block is  x → x + R₊·ReLU(Wx + b) + R₋·ReLU(Wx + b)  with
  two identical banks of K bins and read-outs R₊ = r·u·1ᵀ, R₋ = −r·u·1ᵀ: the forward pass adds
  exactly nothing, so the client trains the server's model as if unmodified, while every bin
  receives the back-propagated signal ±r·uᵀ∂L/∂x of a sample, large enough (r of order 1) that
  the read-out's own drift over the round is a small fraction of it.
- **Decoding from the weights alone.** Bank rows share one query v, so weight decay and the
  momentum's per-step factors act alike on every row and cancel in the difference of
  consecutive bins, which leaves c·x for the one sample between two thresholds. Its scale
  comes from the query (v·x lies between the bin's thresholds), not from the bias update,
  which float32 rounds away at these sizes.

Bins: K thresholds at quantiles of the query's distribution (prior data when granted, else the
server's assumed normal, as in `rtf`). A client's examples in one round (not one batch) share
the K bins, so K is a few times the examples per round: 4,096 for the Flower example's 400.
Through secure aggregation (`clients` = the group's size): LOKI keeps the clients apart with
client-specific convolution kernels; here each client of the group gets its own block of bins
(`client_model`: the other blocks' biases put them out of reach), so the aggregate's block 0
holds the attacked client's examples alone, and the other clients' weight decay, the same on
every row of a block, cancels in the differences. The model grows with the group (2·K·clients
rows).
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
    readout: float = field(default=3.0, metadata={"range": (1e-6, 1e6)})  # r: each bank's read-out size
    # a bin whose weight difference is below this fraction of the largest counts as empty
    min_difference: float = field(default=1e-3, metadata={"range": (0.0, 1.0)})

    def __post_init__(self):
        check(self.bins >= 2, "attack 'loki': bins must be >= 2")
        check(self.assumed_std > 0, "attack 'loki': assumed_std must be > 0")
        check(self.readout > 0, "attack 'loki': readout must be > 0")
        check(self.clients >= 1, "attack 'loki': clients must be >= 1")


OUT_OF_REACH = 1e4  # a bias no sample's query overcomes: the bin stays at zero


class TwinImprintedModel(nn.Module):
    """Per client of the group, two identical banks of K bins in front of the original model,
    with read-outs that cancel; the blocks of the other clients are out of reach."""

    def __init__(self, inner: nn.Module, query: torch.Tensor, thresholds: torch.Tensor, readout: float,
                 generator: torch.Generator, clients: int = 1):
        super().__init__()
        d, k = query.numel(), thresholds.numel()
        self.imprint = nn.Linear(d, 2 * k * clients)
        self.readout = nn.Linear(2 * k * clients, d, bias=False)
        self.thresholds = thresholds
        with torch.no_grad():
            self.imprint.weight.copy_(query.reshape(1, d).expand(2 * k * clients, d))
            direction = torch.randn(d, 1, generator=generator)
            column = readout * direction / direction.norm()
            self.readout.weight.copy_(torch.cat([column.expand(d, k), -column.expand(d, k)] * clients, 1))
        self.live(0)
        self.inner = inner

    def live(self, client: int) -> "TwinImprintedModel":
        """Bins in reach for `client`'s block only."""
        k2 = 2 * self.thresholds.numel()
        with torch.no_grad():
            self.imprint.bias.fill_(-OUT_OF_REACH)
            self.imprint.bias[client * k2:(client + 1) * k2] = -torch.cat([self.thresholds, self.thresholds])
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        bins = torch.relu(self.imprint(flat))
        return self.inner((flat + self.readout(bins)).view_as(x))


@dataclass(frozen=True)
class LokiSecrets:
    """What the server keeps: the query and the bins' thresholds, ascending (the first one as
    calibrated; the model's lowest bin starts at −∞ so that every sample lands in a bin)."""

    query: torch.Tensor
    thresholds: torch.Tensor


def query_thresholds(opt, d: int, prior_data, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The query direction and K ascending thresholds at its distribution's quantiles."""
    if opt.query == "mean":
        query = torch.full((d,), 1.0 / d)
    else:
        query = torch.randn(d, generator=generator)
        query = query / query.norm()
    levels = (torch.arange(opt.bins, dtype=torch.float64) + 0.5) / opt.bins
    use_prior = opt.calibration == "prior" or (opt.calibration == "auto" and prior_data is not None)
    if use_prior:
        if prior_data is None:
            raise GradleakError("attack 'loki': calibration=prior needs --knows prior_data")
        values = prior_data.inputs[:5000].flatten(1).double() @ query.double()
        return query, torch.quantile(values, levels)
    normal = torch.distributions.Normal(torch.tensor(opt.assumed_mean, dtype=torch.float64),
                                        torch.tensor(opt.assumed_std, dtype=torch.float64))
    return query, normal.icdf(levels)


def decode_bins(weight_update: torch.Tensor, secrets: LokiSecrets, min_difference: float) -> torch.Tensor:
    """The samples alone in their bins, from the imprint's weight update (2K rows: the + bank,
    then the − bank; a gradient or a delta, either sign)."""
    k = secrets.thresholds.numel()
    rows = weight_update.double()[:2 * k]  # block 0: the attacked client's
    # the − bank's signal is the + bank's negated: their difference doubles it, and averages
    # the rounding of the two
    bank = rows[:k] - rows[k:]
    difference = bank - torch.cat([bank[1:], torch.zeros_like(bank[:1])])
    size = difference.norm(dim=1)
    occupied = size > min_difference * size.max().clamp_min(1e-300)
    if not occupied.any():
        return torch.zeros(0, weight_update.shape[1])
    c = secrets.thresholds.double()
    spacing = torch.cat([c[1:] - c[:-1], (c[-1:] - c[-2:-1]) if k > 1 else c[-1:].abs()])
    middle = c + spacing / 2  # the query of a sample between threshold k and k + 1
    along = difference[occupied] @ secrets.query.double()
    usable = along.abs() > 1e-12 * difference[occupied].norm(dim=1)
    scaled = difference[occupied][usable] * (middle[occupied][usable] / along[usable])[:, None]
    return scaled.float()


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
        query, thresholds = query_thresholds(opt, math.prod(input_shape), ctx.prior_data, gen)
        sent = thresholds.clone()
        sent[0] = sent[0] - 1e3  # the lowest bin holds everything below it
        crafted = TwinImprintedModel(model, query, sent.float(), opt.readout, gen, opt.clients)
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
        weight = obs.update.tensors.get(f"{IMPRINT}.weight")
        if weight is None or not isinstance(secrets, LokiSecrets):
            raise GradleakError("attack 'loki': the model has no imprint block (run it with --threat malicious "
                                "so the server can send its modified model)")
        x = decode_bins(weight, secrets, self.options.min_difference).reshape(-1, *obs.input_shape)
        x = obs.kind.clamp(x)
        labels = recover_labels(obs, "auto", ctx.generator(17))
        return Reconstruction(inputs=x, labels=labels, extras={"occupied_bins": int(x.shape[0])})
