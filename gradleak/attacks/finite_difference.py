"""A cheaper second derivative for matching a FedSGD gradient: finite differences
with frozen kinks.

A matching iteration needs ∇ₓ D(g(x)) where g(x) = ∇_θ L(x, θ). With u = ∂D/∂g
(taken at the current g, no graph), the chain rule and the symmetry of mixed
partial derivatives give

    ∇ₓ D = ∇ₓ ⟨∇_θ L(x, θ), u⟩ = d/dh ∇ₓ L(x, θ + h·u) |ₕ₌₀ ,

so one forward/backward at the model's own weights (which also yields g) and one
more forward/backward at weights moved along u replace differentiating through
the backward pass (DARTS approximates its Hessian-vector product the same way).
Only ordinary convolutions run — no double backward — about 5 convolution
passes per layer instead of 7 or more.

A plain difference is biased for ReLU networks: units whose pre-activation
crosses zero between the two weight settings contribute a jump ∝ 1/h, and about
h of them cross, so the error does not shrink with h. Frozen kinks remove it:
the first pass records every ReLU / leaky-ReLU mask and max-pool argmax, and
the moved pass replays them, so both passes differentiate the same smooth
function — whose derivative is the one autograd's exact double backward gives
almost everywhere. What remains is the one-sided difference's O(h) error and
float32 rounding: cosine ≥ 0.9998 to the exact gradient on every registered
model (tests/test_finite_difference.py) — immaterial to sign-Adam (IG) and to
L-BFGS on DLG / CPL, measured in docs/optimization-attacks.md.

Applies to FedSGD gradients of models built only from layers `supports` knows
(any kink or randomness elsewhere would be differenced wrongly); otherwise
`UpdateSimulator` keeps the exact double backward. Attacks whose priors read the
model's intermediate activations through hooks (GradInversion's BN prior, the
feature-prior attack) must keep the exact path: this forward runs without a
graph.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..fl.local import batch_loss, batchnorm_mode
from ..fl.training import TrainingSpec

Tensors = dict[str, torch.Tensor]

# h = STEP × ‖θ‖ / ‖u‖. The one-sided difference's error grows with h (deep
# batch-norm nets most: 5e-4 in cosine on ResNet-18 at 1e-5) and float32
# rounding grows as h shrinks (1.7e-4 on LeNet at 1e-6); 3e-6 balances them.
STEP = 3e-6


class _KinkRecorder:
    """Shared by the swapped layers of one model: off, record or replay."""

    def __init__(self):
        self.mode = "off"
        self.kinks: dict[nn.Module, torch.Tensor] = {}


def _piecewise_linear(layer: nn.Module, x: torch.Tensor, negative_slope: float, plain) -> torch.Tensor:
    """A (leaky) ReLU whose slopes are recorded, or replayed as a fixed mask."""
    rec = layer._recorder
    if rec.mode == "replay":
        return x * rec.kinks[layer]
    if rec.mode == "record":
        rec.kinks[layer] = torch.where(x > 0, 1.0, negative_slope).to(x.dtype)
    return plain(x)


class _FrozenReLU(nn.ReLU):
    def forward(self, x):
        return _piecewise_linear(self, x, 0.0, super().forward)


class _FrozenLeakyReLU(nn.LeakyReLU):
    def forward(self, x):
        return _piecewise_linear(self, x, self.negative_slope, super().forward)


class _FrozenMaxPool2d(nn.MaxPool2d):
    def forward(self, x):
        rec = self._recorder
        if rec.mode == "replay":
            index = rec.kinks[self]
            return x.flatten(2).gather(2, index.flatten(2)).view(index.shape)
        if rec.mode == "record":
            out, index = F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                                      self.ceil_mode, return_indices=True)
            rec.kinks[self] = index
            return out
        return super().forward(x)


_FROZEN = {nn.ReLU: _FrozenReLU, nn.LeakyReLU: _FrozenLeakyReLU, nn.MaxPool2d: _FrozenMaxPool2d}
# smooth or piecewise-linear-without-kinks layers, differenced as they are
_SMOOTH = (nn.Conv1d, nn.Conv2d, nn.Linear, nn.modules.batchnorm._BatchNorm, nn.Sigmoid, nn.Tanh,
           nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Identity)
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def supports(model: nn.Module) -> bool:
    """Whether every layer is one whose kinks can be frozen or that has none: torch
    layers listed here, own layers marked `kink_free`, and composite modules that are
    containers or gradleak's own models (whose forward methods apply nonlinearities
    only through modules, so none escapes the recorder — tested per model)."""
    for module in model.modules():
        kind = type(module)
        if (kind in _FROZEN or isinstance(module, _SMOOTH + _CONTAINERS)
                or getattr(module, "kink_free", False)):
            continue
        if not kind.__module__.startswith("gradleak.models") or not list(module.children()):
            return False
    return True


def has_convolutions(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())


def freeze_kinks(model: nn.Module) -> _KinkRecorder:
    """Swap the classes of the ReLU / leaky-ReLU / max-pool layers of `model` (a
    private copy) in place so their kinks can be recorded and replayed."""
    recorder = _KinkRecorder()
    for module in model.modules():
        frozen = _FROZEN.get(type(module))
        if frozen is not None:
            module.__class__ = frozen
            module._recorder = recorder
    return recorder


class DifferencedGradient:
    """x, y → the FedSGD gradient g(x) over `names`, with the backward
    ∇ₓ⟨g, u⟩ computed as a frozen-kink finite difference (module doc)."""

    def __init__(self, model: nn.Module, params: Tensors, buffers: Tensors, names: list[str],
                 training: TrainingSpec):
        """`model`: a private copy, whose kink layers are swapped here (`freeze_kinks`)."""
        self.model, self.recorder = model, freeze_kinks(model)
        self.params = {n: p.detach().requires_grad_(n in names) for n, p in params.items()}
        self.buffers, self.names, self.training = buffers, names, training
        self.observed = [self.params[n] for n in names]
        norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(self.observed))).detach())
        self.observed_norm = norm or 1.0  # all-zero weights: the step is then STEP / ‖u‖

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return list(_Differenced.apply(self, x, y))

    def gradients(self, params: Tensors, x: torch.Tensor, y: torch.Tensor, mode: str, *,
                  of_params: bool, of_inputs: bool) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """(g over `names` or [], [∇ₓL, ∇ᵧL or None] or []) with the kinks `mode`d."""
        soft = of_inputs and y.dtype.is_floating_point and y.requires_grad
        x = x.detach().requires_grad_(of_inputs)
        y = y.detach().requires_grad_(soft)
        inputs = ([params[n] for n in self.names] if of_params else []) + ([x] if of_inputs else []) \
            + ([y] if soft else [])
        buffers = {k: v.clone() for k, v in self.buffers.items()}
        self.recorder.mode = mode
        try:
            with torch.enable_grad(), batchnorm_mode(self.model, self.training.batchnorm):
                loss = batch_loss(functional_call(self.model, (params, buffers), (x,)), y)
                grads = list(torch.autograd.grad(loss, inputs))
        finally:
            self.recorder.mode = "off"
        split = len(self.names) if of_params else 0
        return grads[:split], (grads[split:] + ([] if soft else [None])) if of_inputs else []


class _Differenced(torch.autograd.Function):
    """forward: g(x) (recording kinks and ∇ₓL when a backward will follow);
    backward: the difference of ∇ₓL (and ∇ᵧL for soft labels) along u."""

    @staticmethod
    def forward(ctx, engine: DifferencedGradient, x, y):
        if not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):  # a distance only
            return tuple(engine.gradients(engine.params, x, y, "off", of_params=True, of_inputs=False)[0])
        engine.recorder.kinks = {}
        grads, ctx.base = engine.gradients(engine.params, x, y, "record", of_params=True, of_inputs=True)
        ctx.engine, ctx.kinks = engine, engine.recorder.kinks
        ctx.save_for_backward(x, y)
        return tuple(grads)

    @staticmethod
    def backward(ctx, *grad_update):
        engine, (x, y) = ctx.engine, ctx.saved_tensors
        u = [g if g is not None else torch.zeros_like(p) for p, g in zip(engine.observed, grad_update)]
        u_norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(u))))
        if u_norm == 0:
            return None, torch.zeros_like(x), (torch.zeros_like(y) if ctx.needs_input_grad[2] else None)
        h = STEP * engine.observed_norm / u_norm
        moved = dict(engine.params)
        moved.update(zip(engine.names, torch._foreach_add(engine.observed, u, alpha=h)))
        engine.recorder.kinks = ctx.kinks
        shifted = engine.gradients(moved, x, y, "replay", of_params=False, of_inputs=True)[1]
        grad_x = (shifted[0] - ctx.base[0]) / h
        grad_y = (shifted[1] - ctx.base[1]) / h if ctx.needs_input_grad[2] else None  # soft labels
        return None, grad_x, grad_y
