"""The features a model feeds its first fully connected layer, and their inversion to inputs.

The Cocktail Party Attack separates ∂L/∂W of the first nn.Linear into the vectors that layer
saw. Behind convolutions those are feature embeddings h = f(x), not inputs; the server knows the
extractor f (it sent the model) and inverts each recovered h by optimisation (Kariyappa et al.
ICML 2023, §feature inversion): min_x ‖f(x) − h‖² / ‖h − f(gray)‖² + λ·TV(x), x ∈ [0, 1], or,
when the scale of h is unknown (bias-free layer), 1 − cos(f(x), h).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..options import check
from ..priors import total_variation


class _Reached(Exception):
    """Raised by the hook to stop the forward pass at the layer whose input we want."""


class FeatureExtractor:
    """x → the flattened input of `layer` in `model`, differentiable.

    Runs a private copy of the model (attacks must not touch the observed model; batch-norm layers
    in train mode would update its running statistics) up to `layer` and stops there. The copy
    keeps the model's mode: a client trains in train mode, so batch-norm uses the statistics of
    the batch passed in — invert a whole batch at once to reproduce them.
    """

    def __init__(self, model: nn.Module, layer_name: str):
        self.model = copy.deepcopy(model)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.layer = self.model.get_submodule(layer_name)
        self._captured: torch.Tensor | None = None
        self.layer.register_forward_pre_hook(self._capture)

    def _capture(self, _module, inputs):
        self._captured = inputs[0]
        raise _Reached

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        try:
            self.model(x)
        except _Reached:
            pass
        else:
            raise RuntimeError("the forward pass never reached the feature layer")
        out, self._captured = self._captured, None
        return out.flatten(1)


@dataclass
class FeatureInversionOptions:
    steps: int = 1000  # Adam steps (cosine-annealed learning rate)
    lr: float = 0.05
    tv: float = 0.01  # weight of the total-variation prior per image
    # "box": pixels optimised directly and clamped to [0, 1], each row's error relative to its
    # distance from a flat gray input's features; "sigmoid": pixels = sigmoid(logits), each row's
    # error relative to its own norm (the dense-vertices attack's inversion, tuned with TV 0.1)
    pixels: str = "box"
    # sigmoid pixels: the logit levels the inversion starts from, each a full run, keeping per image
    # the one that ends at the lowest objective. A single mid-gray start can stall: a first layer
    # whose positive-bias kernels sum negative is dead on a gray background, which then gets no
    # gradient (dense-vertices on lenet5 seed 17: 4.8 dB from gray, 19.1 dB from dark, exact features)
    starts: tuple[float, ...] = (0.0,)

    def __post_init__(self):
        check(self.steps >= 1, "feature inversion: steps must be >= 1")
        check(self.lr > 0, "feature inversion: lr must be > 0")
        check(self.tv >= 0, "feature inversion: tv must be >= 0")
        check(self.pixels in ("box", "sigmoid"), "feature inversion: pixels must be 'box' or 'sigmoid'")
        check(len(self.starts) >= 1 and all(math.isfinite(level) for level in self.starts),
              "feature inversion: starts must be one or more finite logit levels")


def invert_features(extract: FeatureExtractor, targets: torch.Tensor, input_shape: tuple[int, ...],
                    options: FeatureInversionOptions, *, scale_known: bool = True,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Inputs in [0, 1] whose features match `targets` (B, F), row by row.

    scale_known: targets carry their true scale (bias-resolved CPA) → relative squared error, with
    the distance of h from the features of a flat gray input as the unit, so every row weighs the
    same whatever its offset (sigmoid features sit around 0.5); otherwise cosine distance.
    """
    targets = targets.detach().float()
    levels = options.starts if options.pixels == "sigmoid" else (0.0,)
    runs = [_invert(extract, targets, input_shape, options, scale_known, generator, level) for level in levels]
    if len(runs) == 1:
        return runs[0][0]
    best = torch.stack([objective for _, objective in runs]).argmin(0)
    return torch.stack([images for images, _ in runs])[best, torch.arange(len(targets))]


def _invert(extract: FeatureExtractor, targets: torch.Tensor, input_shape: tuple[int, ...],
            options: FeatureInversionOptions, scale_known: bool, generator: torch.Generator | None,
            level: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One run of the inversion from one start: the images and each one's final objective."""
    batch = targets.shape[0]
    if options.pixels == "sigmoid":
        logits = (level + 0.1 * torch.randn((batch, *input_shape), generator=generator)).requires_grad_(True)
        unit = targets.pow(2).sum(1) + 1e-12
        parameter, pixels = logits, lambda: torch.sigmoid(logits)
    else:
        with torch.no_grad():
            gray = extract(torch.full((batch, *input_shape), 0.5))
        unit = (targets - gray).pow(2).sum(1).clamp_min(1e-12)
        x = (0.5 + 0.1 * torch.randn((batch, *input_shape), generator=generator)).clamp(0, 1)
        x.requires_grad_(True)
        parameter, pixels = x, lambda: x

    def objective(image: torch.Tensor) -> torch.Tensor:
        features = extract(image)
        if scale_known:
            distance = (features - targets).pow(2).sum(1) / unit
        else:
            distance = 1 - torch.nn.functional.cosine_similarity(features, targets, dim=1)
        return distance + options.tv * total_variation(image, per_image=True)

    optimizer = torch.optim.Adam([parameter], lr=options.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: 0.5 * (1 + math.cos(math.pi * it / options.steps)))
    for _ in range(options.steps):
        optimizer.zero_grad(set_to_none=True)
        objective(pixels()).sum().backward()
        optimizer.step()
        schedule.step()
        if options.pixels == "box":
            with torch.no_grad():
                x.clamp_(0, 1)
    with torch.no_grad():
        images = pixels().detach()
        return images, objective(images)
