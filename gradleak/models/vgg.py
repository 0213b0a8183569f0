"""VGG-16 (Simonyan & Zisserman 2015), as attacked by MKOR (Wang et al.).

Layout is deliberately flat: `features` (conv, [bn], act, pool, ...) and
`classifier` (Linear-act-Linear-act-Linear), both nn.Sequential, so an attack
can set parameters layer by layer. The classifier hidden width is 4096 when
the last feature map is at least 7×7 (224 px, the ImageNet network MKOR uses)
and 512 otherwise (the usual CIFAR VGG, 512→512→512→classes). Max-pools use
ceil mode so odd sizes (25, 28 px) survive all five halvings; for 32/64/224 px
this equals the standard floor mode. `modified=True` is MKOR's "modified
network": each max-pool is removed and the conv before it gets stride 2.
Dropout is omitted: a random mask would make the client's gradient
non-deterministic and the attacks' forward passes inconsistent.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..options import build_options, check
from .base import ModelSpec, make_activation, size_checked
from .building import act_name, conv_out, image_shape

CFG16: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                          512, 512, 512, "M", 512, 512, 512, "M"]


@dataclass(frozen=True)
class VGGOptions:
    batchnorm: bool = False
    width_divisor: int = 1  # divide every channel / hidden width (CPU-friendly variants)
    modified: bool = False  # stride-2 convs instead of max-pools (MKOR)

    def __post_init__(self) -> None:
        check(1 <= self.width_divisor <= 64, "model 'vgg16' option 'width_divisor' must be in 1..64")


class VGG(nn.Module):
    def __init__(self, features: nn.Sequential, classifier: nn.Sequential):
        super().__init__()
        self.features = features
        self.flatten = nn.Flatten()
        self.classifier = classifier

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


@size_checked
def build_vgg16(spec: ModelSpec) -> nn.Module:
    """VGG-16 sized to the input; see the module docstring for the head rule."""
    opts: VGGOptions = build_options(VGGOptions, spec.options, "model 'vgg16'")
    channels, height, width = image_shape(spec, min_size=1)
    act = act_name(spec, "relu")
    div = opts.width_divisor
    layers: list[nn.Module] = []
    in_ch, sizes = channels, [height, width]
    for i, item in enumerate(CFG16):
        if item == "M":
            if not opts.modified:
                layers.append(nn.MaxPool2d(2, stride=2, ceil_mode=True))
            sizes = [conv_out(s, 2, 2, 0, ceil=True) for s in sizes]
            continue
        out_ch = max(1, int(item) // div)
        stride = 2 if opts.modified and CFG16[i + 1] == "M" else 1
        layers.append(nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1))
        if opts.batchnorm:
            layers.append(nn.BatchNorm2d(out_ch))
        layers.append(make_activation(act))
        in_ch = out_ch
    hidden = max(1, (4096 if min(sizes) >= 7 else 512) // div)
    classifier = nn.Sequential(
        nn.Linear(in_ch * sizes[0] * sizes[1], hidden), make_activation(act),
        nn.Linear(hidden, hidden), make_activation(act),
        nn.Linear(hidden, spec.num_classes),
    )
    return VGG(nn.Sequential(*layers), classifier)
