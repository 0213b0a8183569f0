"""Cocktail Party Attack (Kariyappa et al., ICML 2023).

Independent component analysis of the first fully connected layer's weight gradient
(gradleak.analytic.ica): centring, whitening to B components, FastICA unmixing (log-cosh
non-Gaussianity, symmetric decorrelation), optional TV refinement, for images a sparse
non-negative component search seeded by ICA (see `unmix_gradient`), then sign and scale from the
bias gradient (exact) or, for bias-free layers, the skew heuristic plus a [0, 1] rescale.
Needs a first FC layer on the flattened input with at least B units (mlp, twolayer).
Limitation: CPA's feature inversion for an FC layer behind convolutions is not implemented —
such models are refused with a clear error.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..analytic.fc import first_linear, layer_gradients
from ..analytic.ica import resolve_sign_scale, unmix_gradient
from ..options import check
from ..threat import Observation
from .base import Attack, AttackContext, Reconstruction
from .labels import recover_labels


@dataclass
class CPAOptions:
    tv: float = 0.0  # weight of the TV prior in the refinement (images only)
    refine_steps: int = 0  # Adam steps of the CPA objective after FastICA (0 = FastICA only)
    use_bias: bool = True  # fix sign/scale from ∂L/∂b when the layer has a bias
    nonnegative: bool = True  # images: refine ICA by the sparse non-negative component search
    starts: int = 6  # random LP starts per input for the non-negative search

    def __post_init__(self):
        check(self.tv >= 0, "attack 'cpa': tv must be >= 0")
        check(self.refine_steps >= 0, "attack 'cpa': refine_steps must be >= 0")
        check(self.starts >= 0, "attack 'cpa': starts must be >= 0")


class CocktailParty(Attack):
    name = "cpa"
    Options = CPAOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels"})

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        name, _ = first_linear(obs.model, obs.input_shape)
        g_weight, g_bias = layer_gradients(obs.update.as_gradient(), name, need_bias=False)
        image = obs.modality == "image"
        rows = unmix_gradient(g_weight, obs.batch_size, image_shape=obs.input_shape if image else None,
                              tv=opt.tv, refine_steps=opt.refine_steps, seed=ctx.seed,
                              nonnegative=opt.nonnegative and image, starts=opt.starts)
        x = resolve_sign_scale(rows, g_weight, g_bias if opt.use_bias else None,
                               (0.0, 1.0) if image else None)
        x = x.float().reshape(-1, *obs.input_shape)
        if image:
            x = x.clamp(0, 1)
        labels = recover_labels(obs, "auto", ctx.generator(17))
        return Reconstruction(inputs=x, labels=labels)
