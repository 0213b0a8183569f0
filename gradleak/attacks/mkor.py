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
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import GradleakError
from ..options import check
from ..threat import Observation
from .base import Attack, AttackContext, Reconstruction, check_result


@dataclass(frozen=True)
class MKOROptions:
    shuffle: bool = True  # random channel / hidden-unit indices instead of the first ones (§3.4.3)
    noise: float = 0.0  # std of N(0, σ²) replacing zeroed weights, relative to the layer's weight std
    # How the one unknown per feature is pinned when every label is present (see
    # `label_features`): "black" = the tightest black bound, "mean" = the anchor label
    # looks like the others; "auto" = black for point / max features, mean for averages.
    fill: Literal["auto", "black", "mean"] = "auto"
    # softmax prior of the anchor label; 0 = auto (uniform for "black", 0.5 for "mean")
    anchor_prob: float = 0.0
    shifts: int = -1  # number I of 4-direction layers; -1: as many as the channel budget allows
    smooth: int = 5  # box filter size applied to the max/min midpoint (official code: 5); 1 = off

    def __post_init__(self) -> None:
        check(0.0 <= self.noise < 1.0, "attack 'mkor' option 'noise' must be in [0, 1)")
        check(0.0 <= self.anchor_prob < 1.0, "attack 'mkor' option 'anchor_prob' must be in [0, 1)")
        check(self.fill in ("auto", "black", "mean"),
              "attack 'mkor' option 'fill' must be 'auto', 'black' or 'mean'")
        check(self.shifts >= -1, "attack 'mkor' option 'shifts' must be >= -1")
        check(self.smooth >= 1, "attack 'mkor' option 'smooth' must be >= 1")


@dataclass
class _Channel:
    """What one considered conv channel holds: an aggregate of x[color] over a
    region starting at input pixel (off_h, off_w)."""

    color: int
    kind: str  # "max" (x), "min" (1 − x, its max-pool is 1 − local min)
    off_h: int = 0
    off_w: int = 0


@dataclass
class _ConvPlan:
    """Where each considered channel of the last conv feature map sits."""

    channels: dict[int, _Channel] = field(default_factory=dict)
    factor: int = 1  # input pixels per feature pixel
    region: int = 1  # side of the aggregated region, in input pixels
    pooling: str = "none"  # "max", "avg" or "none" (point samples)
    # (gain g, input centre c) of each sigmoid conv, in order: its copies compute σ(g·(v − c))
    sigmoids: list[tuple[float, float]] = field(default_factory=list)
    scale: float = 1.0  # ReLU networks: product of the copy gains (features = scale × pixels)


# Sigmoid copies σ(g·(v − ½)) keep every pre-activation within ±¼, where σ is linear to
# 0.5 %: label means of features then invert to label means of pixels (§3.6).
SIGMOID_GAIN_FIRST = 0.5  # x in [0, 1]
SIGMOID_GAIN = 4.0  # u = σ(±¼) in [0.44, 0.56]
ANCHOR_PROB = 0.5  # default anchor prior for fill="mean"
DEAD_ROWS_BEFORE = 0.5  # kill unconsidered rows before a conv whose rows are > 50 % considered


def _layers(model: nn.Module) -> list[nn.Module]:
    kinds = (nn.Conv2d, nn.Linear, nn.MaxPool2d, nn.AvgPool2d, nn.ReLU, nn.Sigmoid,
             nn.modules.batchnorm._BatchNorm, nn.Dropout, nn.Tanh, nn.LeakyReLU)
    return [m for m in model.modules() if isinstance(m, kinds)]


def _pair(v) -> int:
    return int(v[0] if isinstance(v, tuple) else v)


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
    """MKOR (Wang et al.): malicious FC/conv parameters, label-wise max/min reconstruction."""

    name = "mkor"
    Options = MKOROptions
    malicious = True
    modalities = ("image",)

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: self._check_architecture(_layers(model), input_shape, num_classes)))

    # ------------------------------------------------------------------ server side
    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> nn.Module:
        layers = _layers(model)
        self._check_architecture(layers, input_shape, num_classes)
        gen = ctx.generator(17)
        with torch.no_grad():
            self._set_conv(layers, input_shape, gen)
            # averaged features rarely see a whole label black (MNIST: 41 % of LeNet5's
            # 4×4 means vs 80 % of its stride-2 point samples), so they use the mean prior
            self._fill = self.options.fill if self.options.fill != "auto" else (
                "mean" if self._plan.pooling == "avg" else "black")
            self._set_fc([m for m in layers if isinstance(m, nn.Linear)], num_classes, gen,
                         self._activation(layers) == "sigmoid")
        return model

    def _check_architecture(self, layers, input_shape, num_classes) -> None:
        if len(input_shape) != 3:
            raise GradleakError("attack 'mkor' needs image inputs (C×H×W)")
        if any(isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.Dropout)) for m in layers):
            raise GradleakError("attack 'mkor' supports networks without batch-norm/dropout "
                                "(lenet5, vgg16 without batchnorm)")
        if any(isinstance(m, (nn.Tanh, nn.LeakyReLU)) for m in layers):
            raise GradleakError("attack 'mkor' supports ReLU or sigmoid activations only")
        convs = [m for m in layers if isinstance(m, nn.Conv2d)]
        linears = [m for m in layers if isinstance(m, nn.Linear)]
        if not convs or len(linears) < 2:
            raise GradleakError("attack 'mkor' needs a CNN with conv layers and >= 2 FC layers "
                                "(lenet5 or vgg16)")
        if num_classes < 2 or any(m.out_features < num_classes for m in linears[:-1]):
            raise GradleakError("attack 'mkor' needs every hidden FC layer to be at least as wide "
                                "as the number of classes")
        if layers.index(linears[0]) < layers.index(convs[-1]):
            raise GradleakError("attack 'mkor' needs the FC classifier after all conv layers")

    def _activation(self, layers) -> str:
        return "sigmoid" if any(isinstance(m, nn.Sigmoid) for m in layers) else "relu"

    def _plan_shift_convs(self, layers, first_channels: int) -> set[int]:
        """Indices (into `convs`) of the downsampling convs that get 4-direction
        filters: the last I such convs, I as large as every layer's channels allow."""
        convs = [m for m in layers if isinstance(m, nn.Conv2d)]
        downsampling = []
        for i, conv in enumerate(convs):
            nxt = layers[layers.index(conv) + 1:]
            stop = next((m for m in nxt if isinstance(m, (nn.Conv2d, nn.Linear))), None)
            pooled = any(isinstance(m, (nn.MaxPool2d, nn.AvgPool2d))
                         for m in nxt[:nxt.index(stop) if stop is not None else len(nxt)])
            if pooled or _pair(conv.stride) == 2:
                downsampling.append(i)
        best: set[int] = set()
        limit = len(downsampling) if self.options.shifts < 0 else min(self.options.shifts, len(downsampling))
        for count in range(limit + 1):
            chosen = set(downsampling[len(downsampling) - count:]) if count else set()
            considered, ok = first_channels, True
            for i, conv in enumerate(convs):
                if i in chosen:
                    considered *= 4
                if considered > conv.out_channels:
                    ok = False
                    break
            if ok:
                best = chosen
        return best

    def _set_conv(self, layers, input_shape, gen: torch.Generator) -> None:
        """Copy / min / 4-direction filters (eq. 20), written so the weight statistics
        stay those of the honest initialisation wherever the construction allows:

        * a considered row only silences its *live* inputs; weights from inputs that
          are provably 0 keep their honest values;
        * before a conv whose rows are mostly considered (VGG16's last conv), the
          unconsidered rows are made dead: their weights from considered (max, min)
          pairs turn negative (honest magnitudes) and their bias non-positive, so the
          next conv can keep honest weights on them instead of a wall of zeros;
        * sigmoid networks run their copies in the sigmoid's linear range (§3.6)."""
        colors = input_shape[0]
        act = self._activation(layers)
        pooled_max = any(isinstance(m, nn.MaxPool2d) for m in layers)
        use_min = act == "relu" and pooled_max  # min copies only help when max-pooling
        first = colors * (2 if use_min else 1)
        shift_convs = self._plan_shift_convs(layers, first)
        convs = [m for m in layers if isinstance(m, nn.Conv2d)]
        if first > convs[0].out_channels:
            raise GradleakError("attack 'mkor': the first conv layer has too few channels")
        considered_rows = []
        count = first
        for i in range(len(convs)):
            count *= 4 if i in shift_convs else 1
            considered_rows.append(count)
        # `current[c]` = considered channel at index c of the running feature map
        current: dict[int, _Channel] = {c: _Channel(c, "max") for c in range(colors)}
        dead: set[int] = set()  # input channels that are exactly 0 for every input in [0, 1]
        factor, region = 1, 1
        sigmoids: list[tuple[float, float]] = []
        scale = 1.0
        for i, conv in enumerate(convs):
            k, s, p = _pair(conv.kernel_size), _pair(conv.stride), _pair(conv.padding)
            centre = k // 2
            if i == 0 and use_min:
                sources = [(c, ch, 0, 0, +1.0) for c, ch in current.items()]
                sources += [(c, _Channel(ch.color, "min"), 0, 0, -1.0) for c, ch in current.items()]
            elif i in shift_convs:
                sources = [(c, ch, dh, dw, +1.0) for dh, dw in ((0, 0), (0, 1), (1, 0), (1, 1))
                           for c, ch in current.items()]
            else:
                sources = [(c, ch, 0, 0, +1.0) for c, ch in current.items()]
            if centre + 1 >= k and any(dh or dw for _, _, dh, dw, _ in sources):
                raise GradleakError("attack 'mkor' needs conv kernels of size >= 3")
            outs = (torch.randperm(conv.out_channels, generator=gen)[:len(sources)].tolist()
                    if self.options.shuffle else list(range(len(sources))))
            weight, bias = conv.weight, conv.bias
            honest_bound = float(weight.abs().max())
            if act == "sigmoid":
                gain = SIGMOID_GAIN_FIRST if i == 0 else SIGMOID_GAIN
                sigmoids.append((gain, 0.5))
            else:  # unit copies keep the features at pixel scale; the last conv's taps
                gain = 1.0 if i < len(convs) - 1 else honest_bound  # stay in the honest range
                scale *= gain
            rows = torch.tensor(outs)
            live = torch.tensor([c for c in range(conv.in_channels) if c not in dead])
            silent = self._filler(len(outs), len(live), weight, gen)
            weight[rows[:, None], live[None, :]] = silent
            if bias is not None:
                bias[rows] = 0.0
            new: dict[int, _Channel] = {}
            for out, (c_in, ch, dh, dw, sign) in zip(outs, sources):
                weight[out, c_in, centre + dh, centre + dw] = sign * gain
                if act == "sigmoid":
                    bias[out] = -gain * 0.5  # σ(g·(v − ½)): centred on the linear range
                elif sign < 0:
                    bias[out] = gain  # ReLU(g·(1 − x)) for x in [0, 1]
                new[out] = _Channel(ch.color, ch.kind, ch.off_h + (centre + dh - p) * factor,
                                    ch.off_w + (centre + dw - p) * factor)
            dead = set()
            if (use_min and bias is not None and i + 1 < len(convs)
                    and considered_rows[i + 1] > DEAD_ROWS_BEFORE * convs[i + 1].out_channels):
                dead = self._kill_rows(weight, bias, set(outs), list(current))
            current = new
            factor *= s
            # pools between this conv and the next
            after = layers[layers.index(conv) + 1:]
            for m in after:
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    break
                if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
                    if _pair(m.kernel_size) != 2 or _pair(m.stride or m.kernel_size) != 2:
                        raise GradleakError("attack 'mkor' supports 2×2 pooling only")
                    region += factor
                    factor *= 2
        self._plan = _ConvPlan(current, factor, region,
                               "max" if pooled_max else ("avg" if region > 1 else "none"), sigmoids, scale)

    def _filler(self, rows: int, inputs: int, weight: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Weights of a considered row on its live inputs: 0, or N(0, (noise·std)²)."""
        shape = (rows, inputs, *weight.shape[2:])
        if self.options.noise == 0.0:
            return torch.zeros(shape)
        return torch.randn(shape, generator=gen) * float(weight.std()) * self.options.noise

    @staticmethod
    def _kill_rows(weight: torch.Tensor, bias: torch.Tensor, considered: set[int],
                   inputs: list[int]) -> set[int]:
        """Make every unconsidered row of a ReLU conv output 0 on images in [0, 1].

        Its inputs include max/min copies of every considered region, whose sum is
        at least 1 per pair (max x + (1 − min x) ≥ 1), so negative weights of honest
        magnitude on them outweigh what the remaining honest weights read from the
        unconsidered (garbage) channels by a wide margin. Returns the dead rows."""
        others = torch.tensor([r for r in range(weight.shape[0]) if r not in considered])
        cols = torch.tensor(inputs)
        weight[others[:, None], cols[None, :]] = -weight[others[:, None], cols[None, :]].abs()
        bias[others] = -bias[others].abs()
        return set(others.tolist())

    def _set_fc(self, linears: list[nn.Linear], num_classes: int, gen: torch.Generator,
                sigmoid: bool) -> None:
        """Eqs. 10–13 adapted to cross-entropy (see module docstring): label n
        owns one hidden unit per layer; all owned units of a layer compute the
        same value, so every logit moves together and softmax stays at π."""
        n = num_classes

        def pick(width: int) -> torch.Tensor:
            return torch.randperm(width, generator=gen)[:n] if self.options.shuffle else torch.arange(n)

        owned = pick(linears[0].out_features)
        first_owned = owned.clone()
        first = linears[0]
        shared_row = first.weight[owned[0]].abs().clone()
        first.weight[owned] = shared_row
        if sigmoid:  # centre the sigmoid (features ≈ ½): its slope, the samples' path weight,
            first.weight[owned] = shared_row / shared_row.sum()  # then barely varies
            first.bias[owned] = -0.5
        else:
            first.bias[owned] = first.bias[owned[0]].abs()
        for layer in linears[1:-1]:
            nxt = pick(layer.out_features)
            boost = float(layer.weight.abs().max())
            shared = layer.weight[nxt[0]].abs().clone()
            layer.weight[nxt] = shared
            layer.weight[nxt, owned] += boost
            layer.bias[nxt] = layer.bias[nxt[0]].abs()
            owned = nxt
        last = linears[-1]
        if last.out_features != n:
            raise GradleakError("attack 'mkor': the last FC layer must output one logit per class")
        boost = float(last.weight.abs().max())
        last.weight.copy_(last.weight[0:1].expand_as(last.weight))  # column-constant: logits move together
        last.weight[torch.arange(n), owned] += boost
        anchor = int(torch.randint(n, (1,), generator=gen))
        anchor_prob = self.options.anchor_prob or (1 / n if self._fill == "black" else ANCHOR_PROB)
        if self._fill == "mean" and anchor_prob <= 1 / n:
            raise GradleakError("attack 'mkor': fill=mean needs anchor_prob > 1/classes")
        prior = torch.full((n,), (1 - anchor_prob) / (n - 1))
        prior[anchor] = anchor_prob
        last.bias.copy_(prior.log())
        self._label_rows = first_owned
        self._prior = prior.double()

    # ------------------------------------------------------------------ reconstruction
    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        if not hasattr(self, "_plan"):
            raise GradleakError("attack 'mkor': prepare_model must run before reconstruct")
        model = obs.model
        layers = _layers(model)
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
        rows, prior = self._label_rows, self._prior
        black, white, path = self._probe(model, obs.input_shape, linears[0], rows, prior)
        observed = -torch.cat([grad_w[rows], grad_b[rows, None]], 1)  # O_n = (A_n − π_n T) / B
        features, counts = label_features(observed, prior, obs.batch_size, path, black, white,
                                          self._fill)
        present = (counts > 0).nonzero().flatten()
        images = self._decode(features[present].float(), obs.input_shape, model)
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

    def _decode(self, features: torch.Tensor, input_shape, model: nn.Module) -> torch.Tensor:
        """Per-label conv features [n, D] → images [n, C, H, W]."""
        plan = self._plan
        colors, height, width = input_shape
        conv_out = self._feature_shape(model, input_shape)
        z = features.reshape(features.shape[0], *conv_out)
        z = z / plan.scale
        for gain, centre in reversed(plan.sigmoids):  # σ(g·(v − c)) → v
            z = torch.logit(z.double().clamp(1e-12, 1 - 1e-12)).float() / gain + centre
        if plan.pooling == "avg":
            return self._deconvolve(z, colors, height, width).clamp(0, 1)
        # work on cells of `step` pixels: every region edge falls on a cell edge (regions
        # tile the image since region == factor for 2×2 pools), saving a 16× larger canvas
        step = math.gcd(plan.factor, *[abs(c.off_h) for c in plan.channels.values()],
                        *[abs(c.off_w) for c in plan.channels.values()]) if plan.region > 1 else 1
        cells_h, cells_w = -(-height // step), -(-width // step)
        n = z.shape[0]
        block = plan.region // step if plan.region > 1 else 1
        inf = float("inf")
        upper = torch.full((n, colors, cells_h, cells_w), inf)
        lower = torch.full((n, colors, cells_h, cells_w), -inf)
        total = torch.zeros((n, colors, cells_h, cells_w))
        count = torch.zeros((n, colors, cells_h, cells_w))
        # group channels sharing an offset: one placement per (offset, colour, kind)
        groups: dict[tuple[int, int], list[tuple[int, _Channel]]] = {}
        for idx, ch in plan.channels.items():
            groups.setdefault((ch.off_h, ch.off_w), []).append((idx, ch))
        for (off_h, off_w), members in groups.items():
            idx = torch.tensor([i for i, _ in members])
            vals = z[:, idx]  # [n, m, Hz, Wz]
            if plan.region > 1:
                tiles = vals.repeat_interleave(block, -2).repeat_interleave(block, -1)
                placed, valid = self._place(tiles, off_h // step, off_w // step, cells_h, cells_w)
            else:  # exact point samples: write them straight into the running sums
                rows = torch.arange(vals.shape[-2]) * plan.factor + off_h
                cols = torch.arange(vals.shape[-1]) * plan.factor + off_w
                keep_r, keep_c = (rows >= 0) & (rows < height), (cols >= 0) & (cols < width)
                r, c = rows[keep_r][:, None], cols[keep_c][None, :]
                for j, (_, ch) in enumerate(members):
                    total[:, ch.color, r, c] += vals[:, j][:, keep_r][:, :, keep_c]
                    count[:, ch.color, r, c] += 1
                continue
            for j, (_, ch) in enumerate(members):
                v, ok = placed[:, j], valid[:, j]
                if plan.pooling == "max":
                    if ch.kind == "max":
                        upper[:, ch.color] = torch.where(ok, torch.minimum(upper[:, ch.color], v),
                                                         upper[:, ch.color])
                    else:
                        lower[:, ch.color] = torch.where(ok, torch.maximum(lower[:, ch.color], 1 - v),
                                                         lower[:, ch.color])
                else:
                    total[:, ch.color] += torch.where(ok, v, torch.zeros_like(v))
                    count[:, ch.color] += ok.float()
        if plan.pooling == "max":
            hi = torch.where(torch.isinf(upper), torch.ones_like(upper), upper).clamp(0, 1)
            lo = torch.where(torch.isinf(lower), torch.zeros_like(lower), lower).clamp(0, 1)
            cells = (hi + torch.minimum(lo, hi)) / 2  # eq. 19
            if self.options.smooth > 1:
                # the official code smooths the bound midpoint (5×5, near-box Gaussian)
                image = cells.repeat_interleave(step, -2).repeat_interleave(step, -1)[..., :height, :width]
                return self._smooth(image, self.options.smooth)
        elif plan.pooling == "avg":
            cells = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
        else:
            cells = self._interpolate(total, count, plan.factor, plan.channels)
        image = cells.repeat_interleave(step, -2).repeat_interleave(step, -1)
        return image[..., :height, :width]

    def _deconvolve(self, z: torch.Tensor, colors: int, height: int, width: int) -> torch.Tensor:
        """Average pooling: each feature is (after inverting the sigmoids) the mean of
        x over its region; solve the under-determined linear system with the
        minimum-norm ridge solution x = Aᵀ(AAᵀ + λI)⁻¹v (zero padding counts as 0)."""
        plan = self._plan
        items = sorted(plan.channels.items())
        hz, wz = z.shape[-2:]
        rows_per_color: dict[int, list[torch.Tensor]] = {}
        index_per_color: dict[int, list[tuple[int, int, int]]] = {}
        grid_h = torch.arange(height)[:, None]
        grid_w = torch.arange(width)[None, :]
        for idx, ch in items:
            for i in range(hz):
                top = i * plan.factor + ch.off_h
                in_h = (grid_h >= top) & (grid_h < top + plan.region)
                for j in range(wz):
                    left = j * plan.factor + ch.off_w
                    mask = in_h & (grid_w >= left) & (grid_w < left + plan.region)
                    rows_per_color.setdefault(ch.color, []).append(mask.flatten().float() / plan.region ** 2)
                    index_per_color.setdefault(ch.color, []).append((idx, i, j))
        out = torch.zeros(z.shape[0], colors, height * width)
        for color, rows in rows_per_color.items():
            a = torch.stack(rows).double()
            idx = torch.tensor(index_per_color[color])
            v = z[:, idx[:, 0], idx[:, 1], idx[:, 2]].double()  # [n, m]
            gram = a @ a.T + self.RIDGE * torch.eye(a.shape[0], dtype=a.dtype)
            out[:, color] = (torch.linalg.solve(gram, v.T).T @ a).float()
        return out.reshape(z.shape[0], colors, height, width)

    RIDGE = 1e-3

    @staticmethod
    def _smooth(image: torch.Tensor, size: int) -> torch.Tensor:
        n, c, h, w = image.shape
        pad = size // 2
        padded = F.pad(image.reshape(n * c, 1, h, w), (pad, size - 1 - pad, pad, size - 1 - pad),
                       mode="replicate")
        kernel = torch.full((1, 1, size, size), 1.0 / size ** 2)
        return F.conv2d(padded, kernel).reshape(n, c, h, w)

    @staticmethod
    def _place(tiles: torch.Tensor, off_h: int, off_w: int, cells_h: int,
               cells_w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Put region tiles (already expanded to cells) onto the cell canvas."""
        n, m, th, tw = tiles.shape
        canvas = torch.zeros(n, m, cells_h, cells_w)
        valid = torch.zeros(n, m, cells_h, cells_w, dtype=torch.bool)
        src_h0, dst_h0 = max(0, -off_h), max(0, off_h)
        src_w0, dst_w0 = max(0, -off_w), max(0, off_w)
        hh = min(th - src_h0, cells_h - dst_h0)
        ww = min(tw - src_w0, cells_w - dst_w0)
        if hh > 0 and ww > 0:
            canvas[..., dst_h0:dst_h0 + hh, dst_w0:dst_w0 + ww] = tiles[..., src_h0:src_h0 + hh,
                                                                        src_w0:src_w0 + ww]
            valid[..., dst_h0:dst_h0 + hh, dst_w0:dst_w0 + ww] = True
        return canvas, valid

    @staticmethod
    def _interpolate(total: torch.Tensor, count: torch.Tensor, factor: int, channels) -> torch.Tensor:
        """Fill pixels between exact point samples by normalised convolution with a
        tent kernel (bilinear on a regular lattice); uncovered borders stay 0."""
        offsets_h = sorted({c.off_h % factor for c in channels.values()})
        spacing = factor // max(1, len(offsets_h)) if factor > 1 else 1
        values = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
        mask = (count > 0).float()
        if spacing <= 1:
            return values
        ramp = 1 - torch.arange(-(spacing - 1), spacing).abs().float() / spacing
        kernel = (ramp[:, None] * ramp[None, :])[None, None]
        n, c, h, w = values.shape
        num = F.conv2d((values * mask).reshape(n * c, 1, h, w), kernel, padding=spacing - 1)
        den = F.conv2d(mask.reshape(n * c, 1, h, w), kernel, padding=spacing - 1)
        filled = torch.where(den > 1e-6, num / den.clamp(min=1e-6), torch.zeros_like(num))
        return filled.reshape(n, c, h, w)

    @staticmethod
    def _feature_shape(model: nn.Module, input_shape) -> tuple[int, ...]:
        """Shape of the conv feature map that the first FC layer flattens."""
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        captured: list[torch.Size] = []
        handle = linears[0].register_forward_pre_hook(lambda _m, inp: captured.append(inp[0].shape))
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        shape_hook = convs[-1]
        out_shapes: list[torch.Size] = []
        handle2 = shape_hook.register_forward_hook(lambda _m, _i, out: out_shapes.append(out.shape))
        try:
            with torch.no_grad():
                model(torch.zeros(1, *input_shape))
        finally:
            handle.remove()
            handle2.remove()
        c = out_shapes[0][1]
        flat = captured[0][1]
        side = int(round(math.sqrt(flat / c)))
        return (c, flat // (c * side) if side else 1, side)
