"""Liu et al.'s attack (Liu, Wang, Chen, Lei; §4.2 and App. F): gradient
inversion through an untrained image prior, guided by features that the tensor
method recovers from a wide random layer.

Model side (`prepare_model`): the probe layer, see `gradleak.attacks.feature_probe`.

Attack side (`reconstruct`). x̂ = U_θ(z₀), an untrained convolutional generator
(deep image prior) whose weights θ are optimised with Adam, z₀ fixed noise;
objective (Liu et al. §4.2):
    L_rw(∇ℓ(x̂), G) + α_TV R_TV + α_BN R_BN + α_feat R_feature,
L_rw the cosine distance with per-tensor weights 1/‖G_k‖² (App. F, Liu et al.'s
norm-reweighting), R_BN Σ_l ‖μ_l − μ_l^BN‖ + ‖σ²_l − σ²_l^BN‖ (when the threat
model grants BN statistics), R_feature = mean_i 1 − cos²(φ(x̂_i), ẑ_π(i)) with π
the assignment maximising Σ cos² (the order of the recovered features is
arbitrary), or for large batches the span variant
R_span = mean_i ‖(I − QQᵀ) φ(x̂_i)/‖φ(x̂_i)‖‖², Q an orthonormal basis of span(ẑ).
When the head has a bias and some class is absent from the batch (feature_mode
auto/class), the features are recovered per label (`recover_class_features`)
and π matches only within each label: measured matched cos² 0.93 at B = 16 vs
0.27–0.40 for one decomposition of the whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ..errors import GradleakError
from ..models import last_linear
from ..options import check
from ..threat import Observation
from .base import Attack, AttackContext, PreparedModel, Reconstruction
from .feature_probe import (
    class_feature_loss,
    feature_match_loss,
    find_probe,
    insert_feature_probe,
    recover_class_features,
    recover_features,
    span_loss,
)
from .generators import GENERATORS
from .labels import recover_labels
from .matching import UpdateSimulator, finite_or_inf, step_decay_lr, total_variation, update_distance

ProbeActivation = Literal["relu", "tanh", "sigmoid", "leakyrelu"]


@dataclass
class FeaturePriorOptions:
    iterations: int = 2000  # paper: 10,000 Adam steps
    lr: float = 0.01  # Adam on the generator's weights
    # tv, bn and a constant lr chosen by LPIPS on `python -m benchmarks feature_prior`
    # (ResNet-20, B = 16); GradAttack's BN weight (bn 0.005, tv 0.1) scored worse there
    tv: float = 0.01
    bn: float = 0.2
    # α_feat, which the paper searches per defense; the same benchmark prints LPIPS per α_feat
    feature: float = 1.0
    feature_mode: Literal["auto", "class", "match", "span", "none"] = "auto"
    span_above: int = 8  # auto without per-class recovery: the span variant when B > span_above
    feature_row: int = -1  # class row of the head gradient (match/span); -1 = auto
    width: int = 20000  # random neurons of the probe layer (server side)
    probe_activation: ProbeActivation = "relu"
    centre: bool = True  # centre the probe's input (server side, see `centre_probe`)
    generator: Literal["skip", "upsample"] = "skip"
    per_image: bool = True  # one generator per image (grouped convs) instead of one shared
    train_noise: bool = False  # also optimise the generator's noise input z₀
    decay: bool = False  # step decay shrinks the lr before the generator has fitted
    label_method: Literal["auto", "bias", "weight"] = "auto"

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'feature-prior': iterations must be >= 1")
        check(self.lr > 0, "attack 'feature-prior': lr must be > 0")
        check(min(self.tv, self.bn, self.feature) >= 0,
              "attack 'feature-prior': tv, bn and feature weights must be >= 0")
        check(self.span_above >= 1, "attack 'feature-prior': span_above must be >= 1")
        check(self.width >= 1, "attack 'feature-prior': width must be >= 1")


class FeaturePriorAttack(Attack):
    """Liu et al.: reweighted cosine matching + TV/BN priors through a deep image
    prior, plus tensor-recovered features of a server-inserted random layer."""

    name = "feature-prior"
    budgets = {"quick": {"iterations": 800}, "thorough": {"iterations": 4000}}
    Options = FeaturePriorOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels", "bn_statistics", "local_training"})
    malicious = True
    modalities = ("image",)

    def unsupported(self, model, input_shape, num_classes, modality):
        if len(input_shape) != 3:
            return "needs image inputs (C, H, W)"
        try:
            name, _ = last_linear(model)
        except ValueError:
            return "the model has no linear classifier head to put the feature probe on"
        if not name:
            return "the model is a bare linear layer; there is no feature extractor to probe"
        return super().unsupported(model, input_shape, num_classes, modality)

    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> PreparedModel:
        return PreparedModel(insert_feature_probe(model, self.options.width, self.options.probe_activation,
                                                  seed=ctx.seed * 1_000_003 + 41,
                                                  input_shape=input_shape if self.options.centre else None))

    def feature_term(self, obs: Observation, labels: torch.Tensor) -> tuple[str, object]:
        """('class', [ClassFeatures]), ('match', ẑ), ('span', Q) or ('none', None)."""
        opt = self.options
        batch = labels.shape[0]
        mode = opt.feature_mode
        if mode == "none" or opt.feature == 0 or find_probe(obs.model) is None:
            if mode not in ("auto", "none"):
                raise GradleakError(f"attack 'feature-prior': feature_mode={mode} needs the probe layer "
                                    "(run under --threat malicious) and feature > 0")
            return "none", None
        if mode in ("auto", "class"):
            groups = recover_class_features(obs, labels)
            if groups is not None:
                return "class", groups
            if mode == "class":
                raise GradleakError("attack 'feature-prior': feature_mode=class needs a head bias and "
                                    "at least one class absent from the batch")
            mode = "span" if batch > opt.span_above else "match"
        result = recover_features(obs, batch, opt.feature_row)
        return mode, (result.span if mode == "span" else result.features).float()

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        if len(obs.input_shape) != 3:
            raise GradleakError("attack 'feature-prior' needs image inputs (C, H, W)")
        batch = obs.batch_size
        sim = UpdateSimulator(obs, ctx.device)
        labels = recover_labels(obs, opt.label_method, ctx.generator(17)).to(ctx.device)
        mode, recovered = self.feature_term(obs, labels)
        # Liu et al.'s norm-reweighting: every observed tensor counts with unit norm.
        weights = {n: (1.0 / float(t.pow(2).sum()) if float(t.pow(2).sum()) > 1e-20 else 0.0)
                   for n, t in sim.target.items()}
        bn_target = obs.get("bn_statistics") if (opt.bn and obs.knows("bn_statistics")) else None

        captured: dict[str, list[torch.Tensor]] = {"features": [], "bn": []}
        handles = []
        found = find_probe(sim.model)
        if recovered is not None and found is not None:
            handles.append(found[1].register_forward_hook(
                lambda _m, inputs, _o: captured["features"].append(inputs[0])))
        if bn_target:
            handles += [m.register_forward_hook(lambda _m, inputs, _o: captured["bn"].append(inputs[0]))
                        for m in sim.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

        channels, height, width = obs.input_shape
        with torch.random.fork_rng():  # seeded initial weights, global RNG untouched
            torch.manual_seed(ctx.seed)
            generator = GENERATORS[opt.generator](channels, (height, width),
                                                  copies=batch if opt.per_image else 1).to(ctx.device)
        noise = torch.randn((batch, *generator.noise_shape), generator=ctx.generator(3)).to(ctx.device)
        noise.requires_grad_(opt.train_noise)
        params = list(generator.parameters()) + ([noise] if opt.train_noise else [])
        optimizer = torch.optim.Adam(params, lr=opt.lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, step_decay_lr(opt.iterations) if opt.decay else (lambda _: 1.0))
        if isinstance(recovered, torch.Tensor):
            recovered = recovered.to(ctx.device)
        trace: list[float] = []
        try:
            for it in range(opt.iterations):
                optimizer.zero_grad(set_to_none=True)
                captured["features"].clear()
                captured["bn"].clear()
                x = generator(noise)
                distance = update_distance(sim(x, labels), sim.target, "weighted-cosine", weights)
                loss = distance + opt.tv * total_variation(x)
                if bn_target and len(captured["bn"]) >= len(bn_target):
                    loss = loss + opt.bn * bn_prior(captured["bn"][:len(bn_target)], bn_target)
                if recovered is not None and captured["features"]:
                    features = found[1].unit_features(captured["features"][0])
                    if features.shape[0] == batch:  # first local step saw the whole batch
                        loss = loss + opt.feature * feature_loss(mode, features, recovered)
                loss.backward(inputs=params)  # skip the simulator's weights
                optimizer.step()
                schedule.step()
                if it % 50 == 0 or it == opt.iterations - 1:
                    trace.append(float(distance.detach()))
                    if ctx.progress:
                        ctx.progress(it + 1, opt.iterations, float(distance.detach()))
            x = generator(noise).detach()
            final = finite_or_inf(update_distance(sim(x, labels), sim.target, "weighted-cosine", weights))
        finally:
            for handle in handles:
                handle.remove()
        return Reconstruction(inputs=x.detach().cpu(), labels=labels.cpu(), iterations=opt.iterations,
                              final_distance=final, trace=trace, extras={"feature_mode": mode})


def feature_loss(mode: str, features: torch.Tensor, recovered) -> torch.Tensor:
    if mode == "class":
        return class_feature_loss(features, recovered)
    if mode == "span":
        return span_loss(features, recovered)
    return feature_match_loss(features, recovered)


def bn_prior(inputs: list[torch.Tensor], target: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Σ_l ‖μ_l(x̂) − μ_l‖ + ‖σ²_l(x̂) − σ²_l‖ over BN layers (GradInversion / GradAttack)."""
    total = inputs[0].new_zeros(())
    for h, (mean, var) in zip(inputs, target):
        dims = [0] + list(range(2, h.dim()))
        total = total + (h.mean(dims) - mean.to(h)).norm() + (h.var(dims, unbiased=False) - var.to(h)).norm()
    return total
