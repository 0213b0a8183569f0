"""Liu et al.'s attack (Liu, Wang, Chen, Lei; §4.2 and App. F): gradient
inversion through an untrained image prior, guided by features that the tensor
method recovers from a wide random layer.

Model side (`prepare_model`): the probe layer, see `gradleak.attacks.optimization.feature_probe`.

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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ...errors import GradleakError
from ...models import last_linear
from ...options import check
from ...threat import Observation
from ..base import AttackContext, PreparedModel, Reconstruction, ResumableAttack
from ..engine.candidates import FixedLabels, Network
from ..engine.engine import Engine, Optimizer, ScheduleKind
from ..engine.generators import GENERATORS
from ..engine.objectives import BNStatistics, Matching, Prior, Seen, TotalVariation
from ..replay.labels import recover_labels
from ..replay.matching import UpdateSimulator
from .feature_probe import (
    class_feature_loss,
    feature_match_loss,
    find_probe,
    insert_feature_probe,
    recover_class_features,
    recover_features,
    span_loss,
)

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
    generator: str = "skip"  # a name in GENERATORS (attacks.engine.generators): skip, upsample
    per_image: bool = True  # one generator per image (grouped convs) instead of one shared
    train_noise: bool = False  # also optimise the generator's noise input z₀
    schedule: ScheduleKind = "constant"  # a step decay shrinks the lr before the generator has fitted
    label_method: Literal["auto", "bias", "weight"] = "auto"

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'feature-prior': iterations must be >= 1")
        check(self.lr > 0, "attack 'feature-prior': lr must be > 0")
        check(min(self.tv, self.bn, self.feature) >= 0,
              "attack 'feature-prior': tv, bn and feature weights must be >= 0")
        check(self.span_above >= 1, "attack 'feature-prior': span_above must be >= 1")
        check(self.width >= 1, "attack 'feature-prior': width must be >= 1")
        check(self.generator in GENERATORS, f"attack 'feature-prior': unknown generator '{self.generator}'; "
                                            f"choose from: {', '.join(GENERATORS)}")


class FeaturePriorAttack(ResumableAttack):
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

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
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

        channels, height, width = obs.input_shape
        with torch.random.fork_rng():  # seeded initial weights, global RNG untouched
            torch.manual_seed(ctx.seed)
            generator = GENERATORS.get(opt.generator)(channels, (height, width),
                                                      copies=batch if opt.per_image else 1).to(ctx.device)
        noise = torch.randn((batch, *generator.noise_shape), generator=ctx.generator(3)).to(ctx.device)
        if isinstance(recovered, torch.Tensor):
            recovered = recovered.to(ctx.device)
        found = find_probe(sim.model)
        priors: list[Prior] = [TotalVariation(opt.tv), BNStatistics(opt.bn, bn_target or [])]
        if recovered is not None and found is not None:
            priors.append(FeatureMatch(opt.feature, found[1], mode, recovered, batch))
        engine = Engine(
            matching=Matching(sim, sim.target, "weighted-cosine", weights=weights), labels=FixedLabels(labels),
            candidates=lambda r: Network(generator, noise, opt.train_noise),
            optimizer=Optimizer("adam", opt.lr, schedule=opt.schedule),
            priors=priors, iterations=opt.iterations, model=sim.model, progress=ctx.progress, deadline=ctx.deadline)
        for out in engine.start().doublings(opt.iterations):
            yield Reconstruction(inputs=out.inputs.cpu(), labels=labels.cpu(), iterations=out.iterations,
                                 final_distance=out.distance, **out.trace_fields(), extras={"feature_mode": mode})


@dataclass
class FeatureMatch(Prior):
    """The features of the probe layer's input pulled to those the tensor method
    recovered (`mode`: per class, matched, or their span); only when the first local
    step saw the whole batch."""

    weight: float = 0.0
    probe: nn.Module | None = None
    mode: str = "match"
    recovered: object = None
    batch: int = 0

    def watch(self, model):
        return [self.probe] if self.probe is not None else []

    def __call__(self, seen: Seen) -> torch.Tensor | None:
        captured = seen.layer_inputs.get(self.probe) if self.probe is not None else None
        if not captured:
            return None
        features = self.probe.unit_features(captured[0])
        if features.shape[0] != self.batch:
            return None
        return feature_loss(self.mode, features, self.recovered)


def feature_loss(mode: str, features: torch.Tensor, recovered) -> torch.Tensor:
    if mode == "class":
        return class_feature_loss(features, recovered)
    if mode == "span":
        return span_loss(features, recovered)
    return feature_match_loss(features, recovered)

