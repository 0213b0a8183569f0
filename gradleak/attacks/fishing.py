"""Class fishing (Wen et al., ICML 2022), for one target class.

The server edits the classifier head: every non-target row is zeroed and the target logit gets a
very negative bias, so p_t ≈ 0 for every sample. The back-propagated signal of a sample is then
(p − e_y)ᵀW_head = W_t (p_t − 1[y = t]): samples of other classes contribute (almost) nothing and
the update of all earlier layers is the gradient of the target-class samples alone. The server
counts them from the head's bias gradient (∂L/∂b_t ≈ −n_t/B) and inverts the isolated gradient
analytically through the first fully connected layer (fc-analytic), exact for one target sample.

The edit is blatant (exact-zero rows, an extreme bias): `inspect-model` flags it.
Limits: needs a head with a bias and a first FC layer on the input (e.g. mlp); several target
samples in one batch come back as mixtures unless their first-layer units separate them.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import GradleakError
from ..models import last_linear
from ..options import check
from ..threat import Observation
from .base import Attack, AttackContext, Reconstruction
from .fc_analytic import FCAnalyticOptions, invert_first_layer


@dataclass
class FishingOptions:
    target_class: int = 0
    fish_bias: float = 40.0  # how far the target logit is pushed down
    tolerance: float = 0.02

    def __post_init__(self):
        check(self.target_class >= 0, "attack 'fishing': target_class must be >= 0")
        check(self.fish_bias > 0, "attack 'fishing': fish_bias must be > 0")


class ClassFishing(Attack):
    name = "fishing"
    Options = FishingOptions
    requires = frozenset({"batch_size"})
    malicious = True

    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> nn.Module:
        t = self.options.target_class
        if t >= num_classes:
            raise GradleakError(f"attack 'fishing': target_class {t} is not one of the {num_classes} classes")
        fished = copy.deepcopy(model)
        _, head = last_linear(fished)
        if head.bias is None:
            raise GradleakError("attack 'fishing': the classifier head has no bias to fish with")
        with torch.no_grad():
            keep = head.weight[t].clone()
            head.weight.zero_()
            head.weight[t] = keep
            head.bias.zero_()
            head.bias[t] = -self.options.fish_bias
        return fished

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        t = self.options.target_class
        head_name, _ = last_linear(obs.model)
        g_bias = obs.update.as_gradient().get(f"{head_name}.bias")
        if g_bias is None:
            raise GradleakError("attack 'fishing': the update has no head bias gradient")
        # mean loss: ∂L/∂b_t = (1/B) Σ_i (p_t − 1[y_i = t]) with p_t ≈ 0
        count = int(round(float(-g_bias[t]) * obs.batch_size))
        if count < 1:
            return Reconstruction(inputs=torch.zeros(0, *obs.input_shape), labels=torch.zeros(0, dtype=torch.long),
                                  extras={"target_count": 0})
        x = invert_first_layer(obs, count, FCAnalyticOptions(tolerance=self.options.tolerance))
        if obs.modality == "image":
            x = x.clamp(0, 1)
        return Reconstruction(inputs=x, labels=torch.full((x.shape[0],), t, dtype=torch.long),
                              extras={"target_count": count})
