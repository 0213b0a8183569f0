"""Cocktail Party Attack (Kariyappa et al., ICML 2023).

Independent component analysis of the first fully connected layer's weight gradient
(gradleak.solvers.ica): centring, whitening to B components, FastICA unmixing (log-cosh
non-Gaussianity, symmetric decorrelation), optional TV refinement, and for inputs that are ≥ 0
with many zeros (MNIST-like images, ReLU features) a sparse non-negative vertex search seeded by
ICA (see `unmix_gradient`); then sign and scale from the bias gradient (exact) or, for bias-free
layers, the skew heuristic (plus a [0, 1] rescale for images).

When the first FC layer sits behind convolutions (lenet5, vgg16, ...), what it separates are the
feature vectors h_i = f(x_i) that layer saw; each is then inverted through the known extractor f
by optimisation with a TV prior (gradleak.solvers.features). The layer needs ≥ B units.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ...options import check
from ...solvers.fc import layer_gradients, locate_first_linear
from ...solvers.features import FeatureExtractor, FeatureInversionOptions, invert_features
from ...solvers.ica import resolve_sign_scale, unmix_gradient
from ...threat import Observation
from ..base import Attack, AttackContext, Reconstruction, check_result
from ..replay.labels import recover_labels


@dataclass
class CPAOptions:
    tv: float = 0.0  # weight of the TV prior in the ICA refinement (images on the input layer)
    refine_steps: int = 0  # Adam steps of the CPA objective after FastICA (0 = FastICA only)
    use_bias: bool = True  # fix sign/scale from ∂L/∂b when the layer has a bias
    # sparse non-negative vertex search: images on the input layer; for features `auto` probes the
    # extractor and uses it when features are ≥ 0 with exact zeros (ReLU), not for sigmoid/tanh
    nonnegative: Literal["auto", "true", "false"] = "auto"
    starts: int = 6  # random LP starts per input for the non-negative search (budget)
    feature_steps: int = 1000  # feature inversion (FC layer behind convolutions): Adam steps
    feature_lr: float = 0.05
    feature_tv: float = 0.01

    def __post_init__(self):
        if isinstance(self.nonnegative, bool):  # programmatic use: CPAOptions(nonnegative=False)
            self.nonnegative = "true" if self.nonnegative else "false"
        check(self.nonnegative in ("auto", "true", "false"),
              "attack 'cpa': nonnegative must be auto, true or false")
        check(self.tv >= 0, "attack 'cpa': tv must be >= 0")
        check(self.refine_steps >= 0, "attack 'cpa': refine_steps must be >= 0")
        check(self.starts >= 0, "attack 'cpa': starts must be >= 0")
        self.inversion()  # validates the feature-inversion settings

    def inversion(self) -> FeatureInversionOptions:
        return FeatureInversionOptions(self.feature_steps, self.feature_lr, self.feature_tv)


def _sparse_nonnegative(extract: FeatureExtractor, input_shape: tuple[int, ...],
                        generator: torch.Generator) -> bool:
    """Do the extractor's features look like ReLU features (≥ 0, some exact zeros)?"""
    with torch.no_grad():
        probe = extract(torch.rand((4, *input_shape), generator=generator))
    return bool(probe.min() >= 0 and (probe == 0).any())


class CocktailParty(Attack):
    """Cocktail Party: ICA of the first FC layer's gradient; features behind convs are inverted."""

    name = "cpa"
    Options = CPAOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels"})

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: locate_first_linear(model, input_shape)))

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        layer = locate_first_linear(obs.model, obs.input_shape)
        g_weight, g_bias = layer_gradients(obs.update.as_gradient(), layer.name, need_bias=False)
        bias = g_bias if opt.use_bias else None
        picture = obs.kind.picture_shape(obs.input_shape)  # pictures: unmixed with a TV prior, in [0, 1]
        image = picture is not None
        labels = recover_labels(obs, "auto", ctx.generator(17))
        if layer.on_input:
            nonnegative = image and opt.nonnegative != "false"
            rows = unmix_gradient(g_weight, obs.batch_size, image_shape=picture,
                                  tv=opt.tv, refine_steps=opt.refine_steps, seed=ctx.seed,
                                  nonnegative=nonnegative, starts=opt.starts)
            x = resolve_sign_scale(rows, g_weight, bias, (0.0, 1.0) if image else None)
            x = x.float().reshape(-1, *obs.input_shape)
            return Reconstruction(inputs=x.clamp(0, 1) if image else x, labels=labels)

        # FC layer behind a feature extractor: separate the features, then invert them
        extract = FeatureExtractor(obs.model, layer.name)
        nonnegative = {"true": True, "false": False}.get(opt.nonnegative)
        if nonnegative is None:
            nonnegative = _sparse_nonnegative(extract, obs.input_shape, ctx.generator(23))
        rows = unmix_gradient(g_weight, obs.batch_size, seed=ctx.seed, nonnegative=nonnegative,
                              starts=opt.starts)
        features = resolve_sign_scale(rows, g_weight, bias, None)
        if nonnegative:
            features = features.clamp_min(0)
        x = invert_features(extract, features, obs.input_shape, opt.inversion(),
                            scale_known=bias is not None, generator=ctx.generator(29))
        return Reconstruction(inputs=x, labels=labels, iterations=opt.feature_steps,
                              extras={"feature_layer": layer.name, "feature_dim": int(features.shape[1]),
                                      "nonnegative_search": nonnegative})
