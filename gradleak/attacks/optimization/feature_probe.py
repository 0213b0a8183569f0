"""The server side of Liu et al.'s feature-prior attack (Liu, Wang, Chen, Lei; App. F):
the wide random probe layer and the features the tensor method recovers from it.

Model side (`prepare_model`). The server inserts a wide linear layer between
the feature extractor φ and the classifier head (App. F). Its neurons come in
two sets: "trained" ones that carry the model's own head — here the exact
pass-through ReLU([I; −I] z) with head weights [A, −A], so the model's outputs
and utility are unchanged — and `width` random Gaussian neurons
σ(w_jᵀ z/‖z‖), w_j ~ N(0, I_d), whose head weights start at zero. The random
part with one class row c of the head is WLL's two-layer net: the head-weight
gradient is g_j = Σ_i r_ic σ(w_jᵀ ẑ_i) with r_ic = (p_ic − 1[y_i = c])/B, from
which `gradleak.solvers.tensor_method.tensor_features` recovers the B unit
features ẑ_i up to sign. The layer normalises its input because the tensor
method assumes ‖z‖ = 1 (WLL Assumption 5.1).

The paper calls its server honest-but-curious, but in this framework's
knowledge vocabulary the architecture change is exactly `malicious_model`
("the server may modify the model it sends"): the client trains a model the
server altered for the attack. So the attack is `malicious` and runs under
`--threat malicious` (add `--knows bn_statistics` for the BN prior).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn

from ...errors import GradleakError
from ...models import last_linear
from ...models.base import make_activation
from ...threat import Observation


class WideFeatureProbe(nn.Module):
    """Replaces a classifier head `A z + b` by head(σ(probe(z))) with the same outputs.

    probe rows: [I; −I] (pass-through, 2d trained neurons) then `width` random
    rows applied to z/‖z‖. The random neurons' head weights start at zero, so
    they do not change the predictions, yet their head gradients reveal
    Σ_i r_ic σ(w_jᵀ ẑ_i).
    """

    def __init__(self, head: nn.Linear, width: int, activation: str, generator: torch.Generator):
        super().__init__()
        d, classes = head.in_features, head.out_features
        self.feature_dim, self.width, self.activation = d, width, activation
        eye = torch.eye(d)
        random_rows = torch.randn(width, d, generator=generator)
        self.probe = nn.Linear(d, 2 * d + width, bias=False)
        self.random_act = make_activation(activation)
        self.head = nn.Linear(2 * d + width, classes, bias=head.bias is not None)
        # Server-chosen centre of the random neurons' input (see `centre_probe`).
        self.register_buffer("centre", torch.zeros(d))
        with torch.no_grad():
            self.probe.weight.copy_(torch.cat([eye, -eye, random_rows]).to(head.weight))
            a = head.weight.detach()
            self.head.weight.copy_(torch.cat([a, -a, a.new_zeros(classes, width)], 1))
            if head.bias is not None:
                self.head.bias.copy_(head.bias.detach())

    @property
    def random_weight(self) -> torch.Tensor:
        """(width, d) Gaussian rows of the random neurons."""
        return self.probe.weight[2 * self.feature_dim:].detach()

    def unit_features(self, z: torch.Tensor) -> torch.Tensor:
        """What the random neurons see, and what the tensor method recovers: (z − μ)/‖z − μ‖."""
        return F.normalize(z - self.centre, dim=1, eps=1e-12)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        d = self.feature_dim
        w = self.probe.weight
        trained = F.relu(F.linear(z, w[:2 * d]))
        unit = self.unit_features(z)
        random = self.random_act(F.linear(unit, w[2 * d:]))
        return self.head(torch.cat([trained, random], 1))


def insert_feature_probe(model: nn.Module, width: int, activation: str = "relu", seed: int = 0,
                         input_shape: tuple[int, ...] | None = None) -> nn.Module:
    """A copy of `model` whose last linear layer is wrapped by a `WideFeatureProbe`."""
    model = copy.deepcopy(model)
    name, head = last_linear(model)
    if not name:
        raise GradleakError("feature-prior: the model is a bare linear layer; there is no feature extractor")
    probe = WideFeatureProbe(head, width, activation, torch.Generator().manual_seed(seed))
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, probe)
    centre_probe(model, probe, input_shape, seed)
    return model


def centre_probe(model: nn.Module, probe: WideFeatureProbe, input_shape: tuple[int, ...] | None,
                 seed: int, samples: int = 64) -> None:
    """Set μ to the mean feature of uniform-noise inputs (no data needed).

    Features of ReLU networks all lie in the positive orthant and are nearly
    collinear (pairwise cosine ≈ 0.98 for an untrained ResNet-20 on CIFAR-10),
    which makes the tensor decomposition ill-conditioned (π_min ≈ 0); centring
    them is a bias of the server's own layer and restores the spread.
    """
    if input_shape is None:
        return
    captured: list[torch.Tensor] = []
    handle = probe.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0].detach()))
    saved = {n: b.clone() for n, b in model.named_buffers()}
    try:
        noise = torch.rand((samples, *input_shape), generator=torch.Generator().manual_seed(seed + 1))
        with torch.no_grad():
            model(noise)
    finally:
        handle.remove()
        for n, b in model.named_buffers():
            b.copy_(saved[n])
    probe.centre.copy_(captured[0].mean(0))


def find_probe(model: nn.Module) -> tuple[str, WideFeatureProbe] | None:
    for name, module in model.named_modules():
        if isinstance(module, WideFeatureProbe):
            return name, module
    return None


def head_feature_gradient(obs: Observation, probe_name: str, probe: WideFeatureProbe,
                          row: int = -1) -> torch.Tensor:
    """g (width,): the random neurons' head-weight gradient of one class row.

    Auto row: the class with the largest bias gradient p̄_c − n_c/B, i.e. most
    likely absent from the batch, so that every r_ic = p_ic/B is positive and
    of similar size — the decomposition then sees balanced components.
    """
    grads = obs.update.as_gradient()
    weight = grads[f"{probe_name}.head.weight"]
    if row < 0:
        bias = grads.get(f"{probe_name}.head.bias")
        score = bias if bias is not None else weight[:, :2 * probe.feature_dim].sum(1)
        row = int(score.argmax())
    if row >= weight.shape[0]:
        raise GradleakError(f"attack 'feature-prior': feature_row {row} >= number of classes {weight.shape[0]}")
    return weight[row, 2 * probe.feature_dim:].detach().double()


def recover_features(obs: Observation, batch_size: int, row: int = -1, seed: int = 0):
    """The tensor method on the probe in `obs.model`: a `TensorResult` whose
    `features` (B, d) are unit rows (sign arbitrary) and `span` (d, B) an
    orthonormal basis of their span (from the order-2 moment)."""
    from ...solvers.tensor_method import tensor_decompose

    found = find_probe(obs.model)
    if found is None:
        raise GradleakError("attack 'feature-prior': the model has no feature probe layer "
                            "(run under --threat malicious so the attack can insert it)")
    name, probe = found
    g = head_feature_gradient(obs, name, probe, row)
    # make_activation's leaky ReLU has slope 0.2
    activation = "leaky_relu:0.2" if probe.activation == "leakyrelu" else probe.activation
    return tensor_decompose(g, probe.random_weight.double(), batch_size, activation,
                            generator=torch.Generator().manual_seed(seed))


@dataclass(frozen=True)
class ClassFeatures:
    """Features recovered for the samples of one label: `rows` index the batch
    (in the attack's label order), `features` (n, d) unit rows (sign
    arbitrary, order arbitrary within the class), `span` (d, n) their basis."""

    label: int
    rows: torch.Tensor
    features: torch.Tensor
    span: torch.Tensor


def recover_class_features(obs: Observation, labels: torch.Tensor, seed: int = 0) -> list[ClassFeatures] | None:
    """The tensor method run once per label present in the batch.

    Row c of the random neurons' head gradient is g^c_j = Σ_i r_ic σ(w_jᵀ ẑ_i)
    with r_ic = (p_ic − 1[y_i = c])/B. For the samples outside class c, r_ic ∝
    p_ic ≈ the same as in the rows of absent classes, so g^c − k_c Σ_{a absent} g^a
    leaves (nearly) only the n_c samples of class c, with weights p_ic − 1 < 0.
    k_c matches the prediction mass: Σ_i p_ic = B·∂b_c + n_c from the head's
    bias gradient. Each such combination is a WLL two-layer gradient of only
    n_c samples, which the tensor method decomposes far more accurately than
    all B at once (Liu et al. §4.2: individual recovery "drops drastically when
    [samples] fall into the same class"). Needs the head bias gradient and at
    least one absent class; returns None otherwise.
    """
    from ...solvers.tensor_method import tensor_decompose

    found = find_probe(obs.model)
    if found is None:
        return None
    name, probe = found
    grads = obs.update.as_gradient()
    bias = grads.get(f"{name}.head.bias")
    if bias is None:
        return None
    d = probe.feature_dim
    head = grads[f"{name}.head.weight"][:, 2 * d:].double()  # (classes, width)
    batch = labels.shape[0]
    counts = torch.bincount(labels.cpu(), minlength=head.shape[0]).double()
    absent = counts == 0
    if not bool(absent.any()):
        return None
    mass = (batch * bias.double() + counts).clamp_min(0)  # Σ_i p_ic
    absent_mass = float(mass[absent].sum())
    if absent_mass <= 0:
        return None
    absent_rows = head[absent].sum(0)
    activation = "leaky_relu:0.2" if probe.activation == "leakyrelu" else probe.activation
    weight = probe.random_weight.double()
    groups = []
    for c in counts.nonzero().flatten().tolist():
        n = int(counts[c])
        k = float(mass[c]) * (1 - n / batch) / absent_mass
        result = tensor_decompose(head[c] - k * absent_rows, weight, n, activation,
                                  generator=torch.Generator().manual_seed(seed + c))
        groups.append(ClassFeatures(c, (labels.cpu() == c).nonzero().flatten(),
                                    result.features.float(), result.span.float()))
    return groups


def class_feature_loss(features: torch.Tensor, groups: list[ClassFeatures]) -> torch.Tensor:
    """mean_i 1 − cos²(φ̃(x̂_i), ẑ_π(i)), π matching only within each label."""
    unit = F.normalize(features, dim=1)
    total, count = unit.new_zeros(()), 0
    for group in groups:
        matched = matched_cos2(unit[group.rows.to(unit.device)], group.features.to(unit))
        total = total + (1 - matched).sum()
        count += len(matched)
    return total / max(count, 1)


def matched_cos2(unit: torch.Tensor, recovered: torch.Tensor) -> torch.Tensor:
    """cos² of each row of `unit` with its partner among `recovered`'s rows (both
    unit-norm), the pairing maximising Σ cos² (Hungarian); differentiable in both."""
    cos2 = (unit @ recovered.T).pow(2)
    rows, cols = linear_sum_assignment(-cos2.detach().cpu().numpy())
    return cos2[torch.as_tensor(rows), torch.as_tensor(cols)]


def span_distance(unit: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    """‖(I − QQᵀ) z_i‖ per unit row z_i, Q (d, k) orthonormal."""
    return (1 - (unit @ span).pow(2).sum(1)).clamp_min(0).sqrt()


def feature_errors(true_features: torch.Tensor, labels: torch.Tensor, obs: Observation,
                   seed: int = 0) -> dict[str, float]:
    """How well ẑ matches the true probe inputs (unit rows, batch order), for both
    recoveries: Liu et al.'s span error (mean ‖(I − QQᵀ) z_i‖) and the matched cos²."""
    true = F.normalize(true_features.double(), dim=1)
    batch = true.shape[0]
    out: dict[str, float] = {}
    whole = recover_features(obs, batch, seed=seed)
    out["span_error"] = float(span_distance(true, whole.span.double()).mean())
    out["matched_cos2"] = float(matched_cos2(true, whole.features.double()).mean())
    groups = recover_class_features(obs, labels, seed)
    if groups is not None:
        matched, outside = [], []
        for g in groups:
            t = true[g.rows]
            matched += matched_cos2(t, g.features.double()).tolist()
            outside += span_distance(t, g.span.double()).tolist()
        out["class_matched_cos2"] = sum(matched) / len(matched)
        out["class_span_error"] = sum(outside) / len(outside)
    return out


def feature_match_loss(features: torch.Tensor, recovered: torch.Tensor) -> torch.Tensor:
    """mean_i 1 − cos²(φ(x̂_i), ẑ_π(i)), π maximising Σ cos² (Hungarian)."""
    return 1 - matched_cos2(F.normalize(features, dim=1), recovered).mean()


def span_loss(features: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """mean_i ‖(I − QQᵀ) φ(x̂_i)/‖φ(x̂_i)‖‖², Q (d, k) orthonormal."""
    unit = F.normalize(features, dim=1)
    return (1 - (unit @ basis).pow(2).sum(1)).mean()
