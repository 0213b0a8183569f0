"""MKOR: Maximum Knowledge Orthogonality Reconstruction (Wang, Velipasalar, Gursoy; paper 04).

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

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import GradleakError
from ..options import check
from ..threat import Observation
from .base import Attack, AttackContext, Reconstruction


@dataclass(frozen=True)
class MKOROptions:
    shuffle: bool = True  # random channel / hidden-unit indices instead of the first ones (§3.4.3)
    noise: float = 0.0  # std of N(0, σ²) replacing zeroed weights, relative to the layer's weight std
    anchor_prob: float = 0.5  # softmax prior of the anchor label (resolves the cross-entropy ambiguity)
    shifts: int = -1  # number I of 4-direction layers; -1: as many as the channel budget allows
    smooth: int = 5  # box filter size applied to the max/min midpoint (official code: 5); 1 = off

    def __post_init__(self) -> None:
        check(0.0 <= self.noise < 1.0, "attack 'mkor' option 'noise' must be in [0, 1)")
        check(0.0 < self.anchor_prob < 1.0, "attack 'mkor' option 'anchor_prob' must be in (0, 1)")
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
    sigmoids: int = 0  # sigmoid layers to invert


def _layers(model: nn.Module) -> list[nn.Module]:
    kinds = (nn.Conv2d, nn.Linear, nn.MaxPool2d, nn.AvgPool2d, nn.ReLU, nn.Sigmoid,
             nn.modules.batchnorm._BatchNorm, nn.Dropout, nn.Tanh, nn.LeakyReLU)
    return [m for m in model.modules() if isinstance(m, kinds)]


def _pair(v) -> int:
    return int(v[0] if isinstance(v, tuple) else v)


class MKOR(Attack):
    """MKOR (paper 04): malicious FC/conv parameters, label-wise max/min reconstruction."""

    name = "mkor"
    Options = MKOROptions
    malicious = True
    modalities = ("image",)

    # ------------------------------------------------------------------ server side
    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> nn.Module:
        layers = _layers(model)
        self._check_architecture(layers, input_shape, num_classes)
        gen = ctx.generator(17)
        with torch.no_grad():
            self._set_conv(layers, input_shape, gen)
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
        colors = input_shape[0]
        act = self._activation(layers)
        pooled_max = any(isinstance(m, nn.MaxPool2d) for m in layers)
        use_min = act == "relu" and pooled_max  # min copies only help when max-pooling
        first = colors * (2 if use_min else 1)
        shift_convs = self._plan_shift_convs(layers, first)
        convs = [m for m in layers if isinstance(m, nn.Conv2d)]
        if first > convs[0].out_channels:
            raise GradleakError("attack 'mkor': the first conv layer has too few channels")
        # `current[c]` = considered channel at index c of the running feature map
        current: dict[int, _Channel] = {c: _Channel(c, "max") for c in range(colors)}
        factor, region = 1, 1
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
            std = float(weight.std())
            rows = torch.tensor(outs)
            weight[rows] = torch.randn(len(outs), *weight.shape[1:], generator=gen) * std * self.options.noise
            if bias is not None:
                bias[rows] = torch.randn(len(outs), generator=gen) * std * self.options.noise
            new: dict[int, _Channel] = {}
            for out, (c_in, ch, dh, dw, sign) in zip(outs, sources):
                weight[out, c_in, centre + dh, centre + dw] = sign
                if sign < 0:
                    bias[out] = 1.0  # ReLU(1 − x) for x in [0, 1]
                new[out] = _Channel(ch.color, ch.kind, ch.off_h + (centre + dh - p) * factor,
                                    ch.off_w + (centre + dw - p) * factor)
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
        first_fc = next(i for i, m in enumerate(layers) if isinstance(m, nn.Linear))
        self._plan = _ConvPlan(current, factor, region,
                               "max" if pooled_max else ("avg" if region > 1 else "none"),
                               sum(isinstance(m, nn.Sigmoid) for m in layers[:first_fc]))

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
        if sigmoid:  # keep the sigmoid near its linear range: pre-activation ≈ mean feature
            shared_row /= shared_row.sum()
        first.weight[owned] = shared_row
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
        prior = torch.full((n,), (1 - self.options.anchor_prob) / (n - 1))
        prior[anchor] = self.options.anchor_prob
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
        tensors = obs.update.tensors
        if w_name not in tensors or b_name not in tensors:
            raise GradleakError("attack 'mkor' needs the first FC layer's weight and bias update")
        grad_w, grad_b = tensors[w_name].double(), tensors[b_name].double()
        rows, prior = self._label_rows, self._prior
        per_class, counts = self._class_features(grad_w[rows], grad_b[rows], prior, obs.batch_size)
        present = (counts > 0).nonzero().flatten()
        images = self._decode(per_class[present].float(), obs.input_shape, model)
        reps = counts[present].clamp(min=1)
        inputs = images.repeat_interleave(reps, dim=0)[:obs.batch_size]
        labels = present.repeat_interleave(reps)[:obs.batch_size]
        return Reconstruction(inputs=inputs.clamp(0, 1), labels=labels,
                              extras={"labels_recovered": int(present.numel())})

    @staticmethod
    def _class_features(grad_w: torch.Tensor, grad_b: torch.Tensor, prior: torch.Tensor,
                        batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-label mean features from rows O_n = A_n − π_n T (up to a positive scale).

        Two hypotheses for the unknown batch sum T: (a) the label with the largest
        T − A_n/π_n is absent, so T is exact; (b) every label is present and the
        anchor label looks like the batch mean. The one whose implied label counts
        are closer to integers wins. Returns (features [N, D], counts [N])."""
        observed = -torch.cat([grad_w, grad_b[:, None]], 1)
        candidate = -observed / prior[:, None]  # T − A_n/π_n

        def counts_of(total: torch.Tensor) -> tuple[torch.Tensor, float]:
            unit = total[-1] / batch_size
            c = (observed[:, -1] + prior * total[-1]) / unit
            return c, float((c - c.round()).abs().mean() + (c < -0.5).float().sum())

        absent_total = candidate[candidate[:, -1].argmax()]
        anchor = int(prior.argmax())
        others = torch.arange(len(prior)) != anchor
        total = candidate[anchor].clone()
        for _ in range(50):  # fixed point of hypothesis (b)
            sums = observed + prior[:, None] * total
            mean = sums[others, :-1].sum(0) / sums[others, -1].sum().clamp(min=1e-12)
            count = total[-1] / len(prior)
            total = (torch.cat([mean * count, count.reshape(1)]) - observed[anchor]) / prior[anchor]
        if counts_of(absent_total)[1] <= counts_of(total)[1]:
            total = absent_total
        sums = observed + prior[:, None] * total
        counts = counts_of(total)[0].round().clamp(min=0).long()
        if counts.sum() == 0:
            counts[sums[:, -1].argmax()] = 1
        features = sums[:, :-1] / sums[:, -1].clamp(min=1e-12)[:, None]
        return features, counts

    def _decode(self, features: torch.Tensor, input_shape, model: nn.Module) -> torch.Tensor:
        """Per-label conv features [n, D] → images [n, C, H, W]."""
        plan = self._plan
        colors, height, width = input_shape
        conv_out = self._feature_shape(model, input_shape)
        z = features.reshape(features.shape[0], *conv_out)
        for _ in range(plan.sigmoids):
            z = torch.logit(z.clamp(1e-6, 1 - 1e-6))
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
