"""Tensor feature reconstruction (Wang, Lee, Lei 2023) as a standalone attack on `twolayer`.

The model is f(x) = Aᵀσ(Wx) with W ~ N(0, 1) and every head weight 1/m (`twolayer:init=gaussian`,
the mean-field query of WLL Alg. 1). With cross-entropy, head row c has the gradient
g_j = (1/B) Σ_i r_ic σ(w_j·x_i), r_ic = p_ic − 1[y_i = c] (Wang, Lee, Lei 2023,
eqs. 5.5–5.8, as Liu et al. use it),
which is the WLL observation with residuals r_ic; `gradleak.solvers.tensor_method` recovers the
directions x_i/||x_i|| from it (span from P̂, Jennrich decomposition of the Hermite moment,
H_4 for ReLU). The first-layer gradient is useless here: identical head rows make Σ_c r_ic = 0.

Row choice (`row=-1`): the row of a class absent from the batch (largest gradient sum), where every
r_ic = p_ic = 1/C, so all samples weigh the same (κ = 1 in WLL's bound).
Norms: the identical head rows give p_ic = 1/C exactly, so r_ic ∈ {1/C, 1/C − 1} is known from the
sign of the recovered residual; for the positively homogeneous ReLU family the recovered
coefficient is r_i ||x_i|| / B, which gives ||x_i|| (`scale=residual`, the default for tabular
data). For images (`scale=max`, the default) each image is scaled so its largest pixel is 1, which
measured better on digits than the noisier residual norms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ...errors import GradleakError
from ...models import last_linear
from ...options import check
from ...solvers.tensor_method import tensor_decompose
from ...threat import Observation
from ..base import Attack, AttackContext, Reconstruction, check_result


@dataclass
class TensorOptions:
    row: int = -1  # head row c used as g; -1 = automatic (see module docstring)
    projections: int = field(default=100, metadata={"range": (2, 10_000)})  # random slices for the decomposition
    scale: Literal["auto", "residual", "max", "unit"] = "auto"

    def __post_init__(self):
        check(self.row >= -1, "attack 'tensor': row must be -1 (auto) or a class index")
        check(self.projections >= 2, "attack 'tensor': projections must be >= 2")


def _two_layer_parts(model: nn.Module, input_shape: tuple[int, ...]) -> tuple[str, nn.Linear, str, str]:
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    activations = [m for m in model.modules() if isinstance(m, (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid,
                                                                 nn.Softplus))]
    if len(linears) != 2 or len(activations) != 1 or linears[0][1].in_features != math.prod(input_shape):
        raise GradleakError("attack 'tensor' needs a two-layer network Linear → σ → Linear on the flattened "
                            "input (use --model twolayer:init=gaussian)")
    act = activations[0]
    name = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Softplus: "softplus"}.get(type(act))
    if isinstance(act, nn.LeakyReLU):
        name = f"leaky_relu:{act.negative_slope}"
    return linears[0][0], linears[0][1], linears[1][0], name


class TensorAttack(Attack):
    """Tensor-based feature reconstruction of a two-layer network's hidden input (exact up to scale)."""

    name = "tensor"
    Options = TensorOptions
    requires = frozenset({"batch_size"})
    modalities = ("image", "tabular")

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: _two_layer_parts(model, input_shape)))

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        hidden_name, hidden, head_name, activation = _two_layer_parts(obs.model, obs.input_shape)
        grads = obs.update.as_gradient()
        g_head = grads.get(f"{head_name}.weight")
        if g_head is None:
            raise GradleakError("attack 'tensor': the update has no head-weight gradient")
        g_head = g_head.detach().double()
        classes = g_head.shape[0]
        row = int(torch.argmax(g_head.sum(1))) if opt.row == -1 else opt.row
        if row >= classes:
            raise GradleakError(f"attack 'tensor': row {row} is not one of the {classes} classes")
        batch = obs.batch_size
        W = hidden.weight.detach()
        result = tensor_decompose(g_head[row], W, batch, activation, projections=opt.projections,
                                  generator=ctx.generator(5))
        x = result.features.double()  # (B, d), unit norm
        scale = opt.scale
        if scale == "auto":  # images: brightest pixel = 1 measured better than the residual norms
            homogeneous = activation == "relu" or activation.startswith("leaky_relu")
            scale = ("max" if obs.kind.picture_shape(obs.input_shape) is not None
                     else "residual" if homogeneous and result.signs_resolved else "unit")
        if scale == "residual":
            _, head = last_linear(obs.model)
            if not torch.allclose(head.weight, head.weight[:1].expand_as(head.weight)):
                raise GradleakError("attack 'tensor': scale=residual needs identical head rows "
                                    "(twolayer:init=gaussian); use scale=max")
            # row scale: g = (1/B) Σ r_i a-free σ(·); residual estimate = r_i ||x_i|| / B
            p = 1.0 / classes
            res = result.residuals.double()
            r = torch.where(res > 0, torch.full_like(res, p), torch.full_like(res, p - 1.0))
            norms = (res * batch / r).abs()
            x = x * norms[:, None]
        elif scale == "max":
            x = x / x.abs().amax(1, keepdim=True).clamp_min(1e-12)
        out = x.float().reshape(batch, *obs.input_shape)
        out = obs.kind.clamp(out)
        return Reconstruction(inputs=out, extras={"row": row, "signs_resolved": result.signs_resolved,
                                                  "span": result.span})
