"""Robbing the Fed (Fowl et al., ICLR 2022): a malicious imprint block in front of the model.

prepare_model puts  x → x + R·ReLU(1 v·x − c)  in front of the server's model: K bins on one
linear query v·x with thresholds c_1 < … < c_K at quantiles of the query's distribution, and a
read-out R whose columns are all the same tiny vector (so every bin gets the same back-propagated
signal per sample and the model's output barely changes). Bin k's gradient sums the samples whose
query exceeds c_k; differencing consecutive bins isolates the samples that fall between two
thresholds, and x = ΔW_k / Δb_k recovers a sample exactly when it is alone in its bin.

Calibration of the thresholds: empirical quantiles of v·x over `prior_data` when the threat model
grants it, else quantiles of a normal N(assumed_mean, assumed_std²) for the query — the server's
assumption about the data (defaults: mean-brightness query of [0, 1] images).
"""
from __future__ import annotations

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
class RTFOptions:
    bins: int = field(default=512, metadata={"range": (2, 8192)})  # K; Fowl et al. use a few times the batch size
    query: Literal["mean", "gaussian"] = "mean"  # mean brightness, or a random Gaussian direction
    calibration: Literal["auto", "prior", "assumed"] = "auto"  # auto = prior if granted
    assumed_mean: float = 0.15  # query distribution assumed without prior data
    assumed_std: float = 0.06
    readout: float = 1e-3  # size of the read-out that feeds the bins back into the input
    # relative |Δb| below which a bin counts as empty
    min_bias_grad: float = field(default=1e-6, metadata={"range": (0.0, 1.0)})

    def __post_init__(self):
        check(self.bins >= 2, "attack 'rtf': bins must be >= 2")
        check(self.assumed_std > 0, "attack 'rtf': assumed_std must be > 0")
        check(self.readout > 0, "attack 'rtf': readout must be > 0")


class ImprintedModel(nn.Module):
    """The imprint block followed by the original model."""

    def __init__(self, inner: nn.Module, query: torch.Tensor, thresholds: torch.Tensor, readout: float,
                 generator: torch.Generator):
        super().__init__()
        d, k = query.numel(), thresholds.numel()
        self.imprint = nn.Linear(d, k)
        self.readout = nn.Linear(k, d, bias=False)
        with torch.no_grad():
            self.imprint.weight.copy_(query.reshape(1, d).expand(k, d))
            self.imprint.bias.copy_(-thresholds)
            direction = torch.randn(d, 1, generator=generator)
            self.readout.weight.copy_((readout / k) * direction / direction.norm() * torch.ones(1, k))
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        bins = torch.relu(self.imprint(flat))
        return self.inner((flat + self.readout(bins)).view_as(x))


def query_thresholds(opt, d: int, prior_data, generator: torch.Generator, attack: str
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The bins' query direction (`opt.query`: mean brightness or a random Gaussian direction)
    and `opt.bins` ascending thresholds at its distribution's quantiles: empirical over prior data
    when granted (`opt.calibration`), else the server's assumed normal (rtf and loki)."""
    if opt.query == "mean":
        query = torch.full((d,), 1.0 / d)
    else:
        query = torch.randn(d, generator=generator)
        query = query / query.norm()
    levels = (torch.arange(opt.bins, dtype=torch.float64) + 0.5) / opt.bins
    use_prior = opt.calibration == "prior" or (opt.calibration == "auto" and prior_data is not None)
    if use_prior:
        if prior_data is None:
            raise GradleakError(f"attack '{attack}': calibration=prior needs --knows prior_data")
        values = prior_data.inputs[:5000].flatten(1).double() @ query.double()
        return query, torch.quantile(values, levels)
    normal = torch.distributions.Normal(torch.tensor(opt.assumed_mean, dtype=torch.float64),
                                        torch.tensor(opt.assumed_std, dtype=torch.float64))
    return query, normal.icdf(levels)


class RobbingTheFed(Attack):
    """Robbing the Fed: a malicious imprint layer bins inputs by brightness; bins invert analytically."""

    name = "rtf"
    Options = RTFOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"prior_data", "labels"})
    malicious = True

    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> PreparedModel:
        opt = self.options
        gen = ctx.generator(101)
        query, thresholds = query_thresholds(opt, math.prod(input_shape), ctx.prior_data, gen, self.name)
        # bins sit in the [0.5/K, 1 − 0.5/K] quantiles; the lowest threshold is moved to −∞ in effect
        # so that every sample lands in some bin
        thresholds[0] = thresholds[0] - 1e3
        return PreparedModel(ImprintedModel(model, query, thresholds.float(), opt.readout, gen))

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        grads = obs.update.as_gradient()
        g_w, g_b = grads.get(f"{IMPRINT}.weight"), grads.get(f"{IMPRINT}.bias")
        if g_w is None or g_b is None or not isinstance(obs.model, ImprintedModel):
            raise GradleakError("attack 'rtf': the model has no imprint block (run it with --threat malicious "
                                "so the server can send its modified model)")
        order = torch.argsort(obs.model.imprint.bias.detach(), descending=True)  # ascending thresholds
        g_w, g_b = g_w.double()[order], g_b.double()[order]
        # bin k holds the samples with c_k ≤ v·x < c_{k+1}: difference of consecutive cumulative rows
        d_w = g_w - torch.cat([g_w[1:], torch.zeros_like(g_w[:1])])
        d_b = g_b - torch.cat([g_b[1:], torch.zeros_like(g_b[:1])])
        occupied = d_b.abs() > opt.min_bias_grad * g_b.abs().max().clamp_min(1e-30)
        x = (d_w[occupied] / d_b[occupied, None]).float().reshape(-1, *obs.input_shape)
        x = obs.kind.clamp(x)
        labels = recover_labels(obs, "auto", ctx.generator(17))
        return Reconstruction(inputs=x, labels=labels, extras={"occupied_bins": int(occupied.sum())})
