"""MKOR: Maximum Knowledge Orthogonality Reconstruction (Wang, Velipasalar, Gursoy, WACV 2024).

A malicious server keeps the architecture (LeNet5 / VGG16, original or the
"modified" stride-2 variants) and sends parameters that

* in the FC classifier decouple one path per label (eqs. 10–13), so the first
  FC layer's weight-gradient row of label n over its bias gradient is the
  (path-weighted) mean conv feature of the samples with label n (eq. 9);
* in the conv layers copy each colour (plus a "min" copy 1 − x after the
  first ReLU conv, since a max-pool of 1 − x is one minus a local minimum) and
  split channels into 4 shifted copies at I downsampling convs (eq. 20), so
  every conv feature is the max / min / mean / value of x over a known region.

Reconstruction intersects the max/min bounds (eqs. 14–19), solves for the
pixels from region means after inverting the sigmoids (LeNet, §3.6), or
interpolates exact point samples (stride-2 networks).

Cross-entropy caveat (not in the paper, whose code uses NLLLoss on raw
outputs): with softmax, every sample contributes p_n(x) − 1[y = n] to logit
n, so no row is exactly decoupled. We therefore make all logits move together
(every last-layer column constant across classes except the path weight, and
identical decoupled hidden units), so p = softmax(b) is the same known vector
π for every sample. Row n then observes A_n − π_n T, with A_n the label-n sum
and T the batch sum; T is exact from any absent label (A_n = 0). If every
label is present, an "anchor" label with a large prior π_m absorbs the
ambiguity: T is estimated assuming the anchor class looks like the batch mean,
and the anchor class itself is reconstructed as that mean.

This module holds the options, the label-feature algebra and the attack; the
server's crafting is in `mkor_crafting`, the image decoding in `mkor_decoding`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import GradleakError
from ...options import check
from ...threat import Observation
from ..base import Attack, AttackContext, PreparedModel, Reconstruction, check_result
from .mkor_crafting import MKORSecrets, check_architecture, craft, mkor_layers
from .mkor_decoding import decode_images


@dataclass(frozen=True)
class MKOROptions:
    shuffle: bool = True  # random channel / hidden-unit indices instead of the first ones (§3.4.3)
    # std of N(0, σ²) replacing zeroed weights, relative to the layer's weight std (below 1)
    noise: float = field(default=0.0, metadata={"range": (0.0, 1.0)})
    # How the one unknown per feature is pinned when every label is present (see
    # `label_features`): "black" = the tightest black bound, "mean" = the anchor label
    # looks like the others; "auto" = black for point / max features, mean for averages.
    fill: Literal["auto", "black", "mean"] = "auto"
    # softmax prior of the anchor label; 0 = auto (uniform for "black", 0.5 for "mean")
    anchor_prob: float = field(default=0.0, metadata={"range": (0.0, 1.0)})  # below 1
    # number I of 4-direction layers; -1: as many as the channel budget allows (more than
    # the network's downsampling convs means all of them)
    shifts: int = field(default=-1, metadata={"range": (-1, 100)})
    # box filter size applied to the max/min midpoint (official code: 5); 1 = off
    smooth: int = field(default=5, metadata={"range": (1, 64)})

    def __post_init__(self) -> None:
        check(0.0 <= self.noise < 1.0, "attack 'mkor' option 'noise' must be in [0, 1)")
        check(0.0 <= self.anchor_prob < 1.0, "attack 'mkor' option 'anchor_prob' must be in [0, 1)")
        check(self.fill in ("auto", "black", "mean"),
              "attack 'mkor' option 'fill' must be 'auto', 'black' or 'mean'")
        check(self.shifts >= -1, "attack 'mkor' option 'shifts' must be >= -1")
        check(self.smooth >= 1, "attack 'mkor' option 'smooth' must be >= 1")


def label_features(observed: torch.Tensor, prior: torch.Tensor, batch_size: int, path: float,
                   black: torch.Tensor, white: torch.Tensor,
                   fill: str = "black") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-label (path-weighted) mean conv features and label counts.

    `observed[n]` = (A_n − π_n T) / B: label n's feature sum A_n (last column:
    its path-weighted count S_n) minus π_n times the batch sum T. With the path
    weight s known, T's count column is B·s, which gives every S_n and the
    counts. Per feature j one scalar of T stays unknown (the softmax gradient
    sums to 0 over the logits, so no parameter isolates it). Every sample's
    feature lies between its all-black and all-white values, so every label
    bounds T_j; `fill="black"` takes the tightest bound, i.e. assumes some label
    is black at feature j. That is exact when any label is absent (the
    absent label is black everywhere) and wherever some label's samples are all
    dark there (MNIST's background); otherwise it darkens the labels slightly.
    `fill="mean"` assumes instead that the anchor label (largest π) looks like
    the count-weighted mean of the others (exact only when a label is absent).
    Returns (features [N, D], counts [N])."""
    count_col = observed[:, -1] + prior * path  # S_n / B
    counts = _round_to_total(batch_size * count_col / path, batch_size)
    excess = observed[:, :-1] - black[None] * observed[:, -1:]  # the same rows, measured from black
    up = torch.where(white >= black, 1.0, -1.0).double()
    bounds = -up[None] * excess / prior[:, None]  # per label: up·X ≥ bound
    absent = counts == 0
    if fill == "black" or absent.any():
        shift = up * (bounds[absent].mean(0) if absent.any() and fill == "mean" else bounds.max(0).values)
    else:
        anchor = int(prior.argmax())
        others = torch.arange(len(prior)) != anchor
        rest = count_col[others].sum()
        slope = prior[anchor] / count_col[anchor] - prior[others].sum() / rest
        shift = (excess[others].sum(0) / rest - excess[anchor] / count_col[anchor]) / slope
    sums = excess + prior[:, None] * shift[None]
    features = black[None] + sums / count_col.clamp(min=1e-30)[:, None]
    return features, counts


def _round_to_total(values: torch.Tensor, total: int) -> torch.Tensor:
    """Non-negative integers summing to `total`, closest to `values` (largest remainder)."""
    values = values.clamp(min=0)
    values = values * (total / values.sum().clamp(min=1e-30))
    counts = values.floor().long()
    missing = total - int(counts.sum())
    if missing > 0:
        counts[torch.argsort(values - counts, descending=True)[:missing]] += 1
    return counts


class MKOR(Attack):
    """MKOR (Wang et al.): malicious FC/conv parameters, label-wise max/min reconstruction.
    Crafting: gradleak.attacks.malicious.mkor_crafting; decoding: gradleak.attacks.malicious.mkor_decoding."""

    name = "mkor"
    Options = MKOROptions
    malicious = True
    modalities = ("image",)

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: check_architecture(model, input_shape, num_classes)))

    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> PreparedModel:
        opt = self.options
        secrets = craft(model, input_shape, num_classes, ctx.generator(17), shuffle=opt.shuffle, noise=opt.noise,
                        shifts=opt.shifts, fill=opt.fill, anchor_prob=opt.anchor_prob)
        return PreparedModel(model, secrets)

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        secrets = obs.server_secrets
        if not isinstance(secrets, MKORSecrets):
            raise GradleakError("attack 'mkor': the observation carries no MKOR secrets; the server must "
                                "craft the model it sends (--threat malicious)")
        model = obs.model
        layers = mkor_layers(model)
        linears = [m for m in layers if isinstance(m, nn.Linear)]
        names = {id(p): name for name, p in model.named_parameters()}
        w_name, b_name = names[id(linears[0].weight)], names[id(linears[0].bias)]
        update = obs.update
        if w_name not in update.tensors or b_name not in update.tensors:
            raise GradleakError("attack 'mkor' needs the first FC layer's weight and bias update")
        # a one-step FedAvg delta is lr × the gradient; the decoding needs gradient units
        scale = 1.0 / update.lr if update.kind == "delta" else 1.0
        grad_w = update.tensors[w_name].double() * scale
        grad_b = update.tensors[b_name].double() * scale
        rows, prior = secrets.label_rows, secrets.prior
        black, white, path = self._probe(model, obs.input_shape, linears[0], rows, prior)
        observed = -torch.cat([grad_w[rows], grad_b[rows, None]], 1)  # O_n = (A_n − π_n T) / B
        features, counts = label_features(observed, prior, obs.batch_size, path, black, white,
                                          secrets.fill)
        present = (counts > 0).nonzero().flatten()
        images = decode_images(features[present].float(), obs.input_shape, model, secrets.plan,
                               self.options.smooth)
        reps = counts[present]
        inputs = images.repeat_interleave(reps, dim=0)
        labels = present.repeat_interleave(reps)
        return Reconstruction(inputs=inputs.clamp(0, 1), labels=labels,
                              extras={"labels_recovered": int(present.numel())})

    @staticmethod
    def _probe(model: nn.Module, input_shape, first_fc: nn.Linear, rows: torch.Tensor,
               prior: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The conv features of an all-black and an all-white image, and the path
        weight s = ∂logit_n/∂(owned unit of n) of a mid-grey probe (constant for ReLU
        paths, nearly so for centred sigmoids): one sample of label y adds
        s·(π_n − 1[y = n]) to owned bias n."""
        captured: dict[str, torch.Tensor] = {}
        hooks = [first_fc.register_forward_pre_hook(lambda _m, inp: captured.__setitem__("in", inp[0])),
                 first_fc.register_forward_hook(lambda _m, _i, out: captured.__setitem__("out", out))]
        probe = torch.stack([torch.zeros(input_shape), torch.ones(input_shape),
                             torch.full(input_shape, 0.5)]).requires_grad_(True)
        try:
            with torch.enable_grad():
                logits = model(probe)
                loss = F.cross_entropy(logits[2:], torch.zeros(1, dtype=torch.long))
                grad = torch.autograd.grad(loss, captured["out"])[0][2, rows].double()
        finally:
            for h in hooks:
                h.remove()
        features = captured["in"].detach().double().flatten(1)
        path = float((grad[1:] / prior[1:]).mean())  # label 0 is the probe's own
        return features[0], features[1], path
