"""MKOR's server side: the malicious parameters (Wang, Velipasalar, Gursoy, WACV 2024).

`craft` rewrites a LeNet5 / VGG16-style model in place (copy, min and
4-direction conv filters; one decoupled FC path per label) and returns the
`MKORSecrets` the server keeps: where every considered conv channel sits, the
rows of the first FC layer that each label owns and the softmax prior. The
decoder (gradleak.attacks.malicious.mkor) reads them from the Observation, never from
hidden state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ...errors import GradleakError


@dataclass
class Channel:
    """What one considered conv channel holds: an aggregate of x[color] over a
    region starting at input pixel (off_h, off_w)."""

    color: int
    kind: str  # "max" (x), "min" (1 − x, its max-pool is 1 − local min)
    off_h: int = 0
    off_w: int = 0


@dataclass
class ConvPlan:
    """Where each considered channel of the last conv feature map sits."""

    channels: dict[int, Channel] = field(default_factory=dict)
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


@dataclass(frozen=True)
class MKORSecrets:
    """What the malicious server remembers about the parameters it sent."""

    plan: ConvPlan
    fill: str  # "black" or "mean": how the one unknown per feature is pinned (see label_features)
    label_rows: torch.Tensor  # first-FC row owned by each label
    prior: torch.Tensor  # softmax prior π of the logits, float64


def mkor_layers(model: nn.Module) -> list[nn.Module]:
    kinds = (nn.Conv2d, nn.Linear, nn.MaxPool2d, nn.AvgPool2d, nn.ReLU, nn.Sigmoid,
             nn.modules.batchnorm._BatchNorm, nn.Dropout, nn.Tanh, nn.LeakyReLU)
    return [m for m in model.modules() if isinstance(m, kinds)]


def _pair(v) -> int:
    return int(v[0] if isinstance(v, tuple) else v)


def craft(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, gen: torch.Generator, *,
          shuffle: bool, noise: float, shifts: int, fill: str, anchor_prob: float) -> MKORSecrets:
    """Write MKOR's parameters into `model` (in place) and return the server's secrets."""
    return _Crafter(shuffle, noise, shifts, fill, anchor_prob).craft(model, input_shape, num_classes, gen)


def check_architecture(model: nn.Module, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Raise GradleakError (one line) when MKOR cannot be crafted into `model`."""
    _Crafter.check_architecture(mkor_layers(model), input_shape, num_classes)


class _Crafter:
    def __init__(self, shuffle: bool, noise: float, shifts: int, fill: str, anchor_prob: float):
        self.shuffle, self.noise, self.shifts = shuffle, noise, shifts
        self.fill, self.anchor_prob = fill, anchor_prob

    def craft(self, model: nn.Module, input_shape, num_classes: int, gen: torch.Generator) -> MKORSecrets:
        layers = mkor_layers(model)
        self.check_architecture(layers, input_shape, num_classes)
        with torch.no_grad():
            plan = self._set_conv(layers, input_shape, gen)
            # averaged features rarely see a whole label black (MNIST: 41 % of LeNet5's
            # 4×4 means vs 80 % of its stride-2 point samples), so they use the mean prior
            if self.fill == "auto":
                self.fill = "mean" if plan.pooling == "avg" else "black"
            label_rows, prior = self._set_fc([m for m in layers if isinstance(m, nn.Linear)], num_classes, gen,
                                             self._activation(layers) == "sigmoid")
        return MKORSecrets(plan, self.fill, label_rows, prior)

    @staticmethod
    def check_architecture(layers, input_shape, num_classes) -> None:
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
        limit = len(downsampling) if self.shifts < 0 else min(self.shifts, len(downsampling))
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

    def _set_conv(self, layers, input_shape, gen: torch.Generator) -> ConvPlan:
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
        current: dict[int, Channel] = {c: Channel(c, "max") for c in range(colors)}
        dead: set[int] = set()  # input channels that are exactly 0 for every input in [0, 1]
        factor, region = 1, 1
        sigmoids: list[tuple[float, float]] = []
        scale = 1.0
        for i, conv in enumerate(convs):
            k, s, p = _pair(conv.kernel_size), _pair(conv.stride), _pair(conv.padding)
            centre = k // 2
            if i == 0 and use_min:
                sources = [(c, ch, 0, 0, +1.0) for c, ch in current.items()]
                sources += [(c, Channel(ch.color, "min"), 0, 0, -1.0) for c, ch in current.items()]
            elif i in shift_convs:
                sources = [(c, ch, dh, dw, +1.0) for dh, dw in ((0, 0), (0, 1), (1, 0), (1, 1))
                           for c, ch in current.items()]
            else:
                sources = [(c, ch, 0, 0, +1.0) for c, ch in current.items()]
            if centre + 1 >= k and any(dh or dw for _, _, dh, dw, _ in sources):
                raise GradleakError("attack 'mkor' needs conv kernels of size >= 3")
            outs = (torch.randperm(conv.out_channels, generator=gen)[:len(sources)].tolist()
                    if self.shuffle else list(range(len(sources))))
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
            new: dict[int, Channel] = {}
            for out, (c_in, ch, dh, dw, sign) in zip(outs, sources):
                weight[out, c_in, centre + dh, centre + dw] = sign * gain
                if act == "sigmoid":
                    bias[out] = -gain * 0.5  # σ(g·(v − ½)): centred on the linear range
                elif sign < 0:
                    bias[out] = gain  # ReLU(g·(1 − x)) for x in [0, 1]
                new[out] = Channel(ch.color, ch.kind, ch.off_h + (centre + dh - p) * factor,
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
        return ConvPlan(current, factor, region,
                        "max" if pooled_max else ("avg" if region > 1 else "none"), sigmoids, scale)

    def _filler(self, rows: int, inputs: int, weight: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Weights of a considered row on its live inputs: 0, or N(0, (noise·std)²)."""
        shape = (rows, inputs, *weight.shape[2:])
        if self.noise == 0.0:
            return torch.zeros(shape)
        return torch.randn(shape, generator=gen) * float(weight.std()) * self.noise

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
                sigmoid: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Eqs. 10–13 adapted to cross-entropy (see module docstring): label n
        owns one hidden unit per layer; all owned units of a layer compute the
        same value, so every logit moves together and softmax stays at π."""
        n = num_classes

        def pick(width: int) -> torch.Tensor:
            return torch.randperm(width, generator=gen)[:n] if self.shuffle else torch.arange(n)

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
        anchor_prob = self.anchor_prob or (1 / n if self.fill == "black" else ANCHOR_PROB)
        if self.fill == "mean" and anchor_prob <= 1 / n:
            raise GradleakError("attack 'mkor': fill=mean needs anchor_prob > 1/classes")
        prior = torch.full((n,), (1 - anchor_prob) / (n - 1))
        prior[anchor] = anchor_prob
        last.bias.copy_(prior.log())
        return first_owned, prior.double()
