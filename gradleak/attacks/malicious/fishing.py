"""Class fishing (Wen et al., ICML 2022), for one target class.

The server edits the classifier head: every non-target row is zeroed and the target logit gets a
very negative bias, so p_t ≈ 0 for every sample. The back-propagated signal of a sample is then
(p − e_y)ᵀW_head = W_t (p_t − 1[y = t]): samples of other classes contribute (almost) nothing and
the update of every layer before the head is the gradient of the target-class samples alone. The
server counts them from the head's bias gradient (∂L/∂b_t ≈ −n_t/B) and inverts that isolated
gradient:
- analytically through the first fully connected layer (fc-analytic) when the model starts with
  one (mlp): exact for one target sample;
- otherwise (conv-first models: lenet, lenet5, convnet, ...) by Inverting Gradients on the
  pre-head update only (the head's own gradient still mixes every sample: its zeroed rows see
  p_j h_i for all i), with the label known to be t and the batch size n_t.

The edit is blatant (exact-zero rows, an extreme bias): `inspect-model` flags it.
Limits: needs a head with a bias; several target samples in one batch come back as mixtures
(analytic) or as a harder n_t-sample inversion (IG).
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ...errors import GradleakError
from ...fl import TrainingSpec
from ...models import last_linear
from ...options import check
from ...solvers.fc import locate_first_linear
from ...threat import Observation, make_threat_model, observe
from ..analytic.fc_analytic import FCAnalyticOptions, invert_first_layer
from ..base import Attack, AttackContext, PreparedModel, Reconstruction
from ..optimization.ig import IGOptions, InvertingGradients


@dataclass
class FishingOptions:
    target_class: int = 0
    fish_bias: float = 40.0  # how far the target logit is pushed down
    tolerance: float = 0.02  # analytic inversion: RMS distance for row candidates to agree
    # analytic: first FC layer on the input (mlp); ig: Inverting Gradients on the pre-head update;
    # auto: analytic when the model allows it, else ig
    inversion: Literal["auto", "analytic", "ig"] = "auto"
    iterations: int = 2500  # IG settings for the isolated gradient (see attack 'ig')
    lr: float = 0.1
    tv: float = 1e-6
    restarts: int = 1

    def __post_init__(self):
        check(self.target_class >= 0, "attack 'fishing': target_class must be >= 0")
        check(self.fish_bias > 0, "attack 'fishing': fish_bias must be > 0")
        check(self.iterations >= 1, "attack 'fishing': iterations must be >= 1")
        check(self.lr > 0, "attack 'fishing': lr must be > 0")
        check(self.tv >= 0, "attack 'fishing': tv must be >= 0")
        check(self.restarts >= 1, "attack 'fishing': restarts must be >= 1")


class ClassFishing(Attack):
    """Class fishing: zero the head but for one class, invert that class's isolated gradient."""

    name = "fishing"
    Options = FishingOptions
    requires = frozenset({"batch_size"})
    malicious = True

    def unsupported(self, model, input_shape, num_classes, modality):
        if self.options.target_class >= num_classes:
            return f"target_class {self.options.target_class} is not one of the {num_classes} classes"
        try:
            _, head = last_linear(model)
        except ValueError:
            return "the model has no linear classifier head to fish with"
        if head.bias is None:
            return "the classifier head has no bias to fish with"
        if self.options.inversion == "analytic" and not locate_first_linear(model, input_shape).on_input:
            return "inversion=analytic needs a linear first layer; use inversion=ig (or auto) behind convolutions"
        return super().unsupported(model, input_shape, num_classes, modality)

    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> PreparedModel:
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
        return PreparedModel(fished)

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        t = opt.target_class
        head_name, _ = last_linear(obs.model)
        g_bias = obs.update.as_gradient().get(f"{head_name}.bias")
        if g_bias is None:
            raise GradleakError("attack 'fishing': the update has no head bias gradient")
        # mean loss: ∂L/∂b_t = (1/B) Σ_i (p_t − 1[y_i = t]) with p_t ≈ 0
        count = int(round(float(-g_bias[t]) * obs.batch_size))
        if count < 1:
            # The class was fixed when the model was crafted, before the server saw this batch;
            # returning nothing silently would read as a defense that held.
            message = nothing_fished_message(t, g_bias, obs.batch_size, obs.num_classes)
            warnings.warn(message, stacklevel=2)
            return Reconstruction(inputs=torch.zeros(0, *obs.input_shape), labels=torch.zeros(0, dtype=torch.long),
                                  extras={"target_count": 0, "nothing_reconstructed": True, "message": message})
        labels = torch.full((count,), t, dtype=torch.long)
        method = opt.inversion
        if method == "auto":
            method = "analytic" if locate_first_linear(obs.model, obs.input_shape).on_input else "ig"
        if method == "analytic":
            x = invert_first_layer(obs, count, FCAnalyticOptions(tolerance=opt.tolerance))
            x = obs.kind.clamp(x)
            extras = {"target_count": count, "inversion": "analytic"}
            if x.shape[0] == 0:
                extras["nothing_reconstructed"] = True
            return Reconstruction(inputs=x, labels=labels[: x.shape[0]], extras=extras)
        rec = InvertingGradients(IGOptions(iterations=opt.iterations, lr=opt.lr, tv=opt.tv,
                                           restarts=opt.restarts)).reconstruct(
            isolated_observation(obs, head_name, labels), ctx)
        return Reconstruction(inputs=rec.inputs, labels=labels, iterations=rec.iterations,
                              final_distance=rec.final_distance, trace=rec.trace,
                              trace_iterations=rec.trace_iterations, trace_seconds=rec.trace_seconds,
                              extras={"target_count": count, "inversion": "ig"})


def nothing_fished_message(target: int, g_bias: torch.Tensor, batch_size: int, num_classes: int) -> str:
    """One line saying that no example of the target class was in the batch, and which
    classes the same update shows. With the head fished, every other of the K logits is 0 and
    p_j ≈ 1/(K − 1), so ∂L/∂b_j = 1/(K − 1) − n_j/B reveals each class's count n_j from the
    update alone (no ground truth): a later round could fish one of them."""
    g = g_bias.detach().double().cpu()
    counts = (batch_size / max(len(g) - 1, 1) - g * batch_size).round()
    present = [j for j in range(min(num_classes, len(g))) if j != target and counts[j] >= 1]
    seen = (f"; the update shows examples of class{'es' if len(present) > 1 else ''} "
            f"{', '.join(map(str, present))}") if present else ""
    return (f"attack 'fishing': nothing reconstructed: no example of target_class {target} in the batch "
            f"(the head's bias gradient counts 0){seen}")


def isolated_observation(obs: Observation, head_name: str, labels: torch.Tensor) -> Observation:
    """The server's view of the target samples alone: the update without the head's tensors (the
    only ones other samples still reach), batch size n_t and labels t, which fishing revealed."""
    upstream = {n: v for n, v in obs.update.tensors.items() if not n.startswith(f"{head_name}.")}
    if not upstream:
        raise GradleakError("attack 'fishing': the model has no layer before the head to invert")
    grants = ["labels"] + [k for k in ("local_training", "defenses") if obs.knows(k)]
    training = obs.training if obs.knows("local_training") else TrainingSpec(lr=obs.update.lr)
    return observe(obs.update.replace(tensors=upstream), obs.model, make_threat_model("honest", grants),
                   input_shape=obs.input_shape, num_classes=obs.num_classes, training=training,
                   batch_size=len(labels), labels=labels,
                   defenses=obs.get("defenses") if obs.knows("defenses") else [], modality=obs.modality)
