"""The "ConvNet" of Geiping et al., Inverting Gradients (inversefed / breaching).

Eight 3×3 conv-bn-act blocks with widths w,2w,2w,4w,4w,4w | maxpool3 | 4w,4w |
maxpool3, then one linear layer. inversefed's default width is 64; 32 is the
CPU-friendly default here (`width=64` restores the original). Pooling switches
to ceil mode only for inputs too small for two floor-mode 3×3 pools (< 9 px).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import nn

from ..options import build_options, check
from .base import ModelSpec, make_activation, size_checked
from .building import act_name, conv_out, image_shape


@dataclass(frozen=True)
class ConvNetOptions:
    width: int = 32
    batchnorm: bool = True

    def __post_init__(self) -> None:
        check(self.width >= 1, "model 'convnet' option 'width' must be at least 1")


@size_checked
def build_convnet(spec: ModelSpec) -> nn.Module:
    """inversefed ConvNet (8 conv blocks, two 3×3 max-pools, linear head)."""
    opts: ConvNetOptions = build_options(ConvNetOptions, spec.options, "model 'convnet'")
    channels, height, width = image_shape(spec, min_size=1)
    act = act_name(spec, "relu")
    w = opts.width
    ceil = min(height, width) < 9
    plan: list[int | str] = [w, 2 * w, 2 * w, 4 * w, 4 * w, 4 * w, "pool", 4 * w, 4 * w, "pool"]
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    in_ch, sizes, conv_i, pool_i = channels, [height, width], 0, 0
    for item in plan:
        if item == "pool":
            layers[f"pool{pool_i}"] = nn.MaxPool2d(3, ceil_mode=ceil)
            sizes = [conv_out(s, 3, 3, 0, ceil) for s in sizes]
            pool_i += 1
            continue
        out_ch = int(item)
        layers[f"conv{conv_i}"] = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1)
        layers[f"bn{conv_i}"] = nn.BatchNorm2d(out_ch) if opts.batchnorm else nn.Identity()
        layers[f"act{conv_i}"] = make_activation(act)
        in_ch, conv_i = out_ch, conv_i + 1
    layers["flatten"] = nn.Flatten()
    layers["linear"] = nn.Linear(in_ch * sizes[0] * sizes[1], spec.num_classes)
    return nn.Sequential(layers)
