"""A cheaper second derivative for matching a FedSGD gradient: finite differences
with frozen kinks.

A matching iteration needs ∇ₓ D(g(x)) where g(x) = ∇_θ L(x, θ). With u = ∂D/∂g
(taken at the current g, no graph), the chain rule and the symmetry of mixed
partial derivatives give

    ∇ₓ D = ∇ₓ ⟨∇_θ L(x, θ), u⟩ = d/dh ∇ₓ L(x, θ + h·u) |ₕ₌₀ ,

so one forward/backward at the model's own weights (which also yields g) and one
more forward/backward at weights moved along u replace differentiating through
the backward pass (DARTS approximates its Hessian-vector product the same way).
Neither pass runs back to the input: the first layer's share of the difference
is linear in its weights and is taken once, from both passes' gradients at its
output (`_EntryLayer`).
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
model (tests/attacks/replay/test_finite_difference.py) — immaterial to sign-Adam (IG) and to
L-BFGS on DLG / CPL, measured in docs/optimization-attacks.md.

Applies to FedSGD gradients of models built only from layers `supports` knows
(any kink or randomness elsewhere would be differenced wrongly); otherwise
`UpdateSimulator` keeps the exact double backward. Attacks whose priors read the
model's intermediate activations through hooks (GradInversion's BN prior, the
feature-prior attack) must keep the exact path: this forward runs without a
graph.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...fl.local import batch_loss, batchnorm_mode
from ...fl.training import TrainingSpec

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


@dataclass(frozen=True)
class _EntryLayer:
    """The one layer through which the input enters the model — a convolution or
    linear layer reading x itself (or a flattened view of it). Its input gradient
    is linear in its weight, so the difference of the two passes' input gradients
    is one backward through it, summed over two weight / output-gradient pairs:

        [(W + h·U)ᵀ δ′ − Wᵀ δ] / h = Wᵀ (δ′ − δ) / h + Uᵀ δ′,

    and neither pass has to reach the input. On the few input channels of a first
    layer, Wᵀ δ as a matrix product folded back to the image (`F.fold`) is 3–4×
    faster than `convolution_backward` (LeNet's 5×5 stride-2 layer: 156 vs 648 µs)."""

    module: nn.Module
    weight_name: str

    def input_gradient(self, pairs: list[tuple[torch.Tensor, torch.Tensor]],
                       input_shape: torch.Size) -> torch.Tensor:
        """Σ Wᵀ δ over (δ, W) pairs, as the layer's backward to its input."""
        if isinstance(self.module, nn.Linear):
            return sum(grad @ weight for grad, weight in pairs).view(input_shape)
        m = self.module
        columns = sum(weight.flatten(1).t() @ grad.flatten(2) for grad, weight in pairs)
        return F.fold(columns, input_shape[-2:], m.kernel_size, m.dilation, m.padding, m.stride)


def _entry_layer(model: nn.Module, input_shape: tuple[int, ...]) -> _EntryLayer | None:
    """The layer that alone reads the input, found by one probe forward, if it is a
    linear layer or a plain 2-d convolution called once; else None (the passes then
    differentiate down to the input itself)."""
    device = next(model.parameters()).device
    probe = torch.zeros(1, *input_shape, device=device)
    readers: list[nn.Module] = []
    calls: dict[nn.Module, int] = {}

    def note(module, args):
        calls[module] = calls.get(module, 0) + 1
        first = args[0] if args else None
        if (isinstance(first, torch.Tensor) and first.data_ptr() == probe.data_ptr()
                and first.numel() == probe.numel() and not isinstance(module, (nn.Flatten, nn.Identity))):
            readers.append(module)  # Flatten / Identity pass a view of x on to its reader

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_pre_hook(note) for m in leaves]
    try:
        with torch.no_grad(), batchnorm_mode(model, "eval"):
            model(probe)
    finally:
        for handle in handles:
            handle.remove()
    if len(readers) != 1 or calls[readers[0]] != 1:
        return None
    layer = readers[0]
    plain_conv = (type(layer) is nn.Conv2d and layer.groups == 1 and layer.padding_mode == "zeros"
                  and not isinstance(layer.padding, str))
    if not (plain_conv or type(layer) is nn.Linear):
        return None
    name = next(n for n, m in model.named_modules() if m is layer)
    return _EntryLayer(layer, f"{name}.weight" if name else "weight")


class DifferencedGradient:
    """x, y → the FedSGD gradient g(x) over `names`, with the backward
    ∇ₓ⟨g, u⟩ computed as a frozen-kink finite difference (module doc)."""

    def __init__(self, model: nn.Module, names: list[str], training: TrainingSpec,
                 input_shape: tuple[int, ...]):
        """`model`: a private copy holding the observed weights. Its kink layers are
        swapped here (`freeze_kinks`) and it is called directly, the second pass's
        weights put straight into its parameter slots — `functional_call`'s
        re-parametrisation costs ~80 µs per pass, 5–10 % of a small model's iteration.
        Batch norm in train mode updates the copy's running statistics, which its
        output never reads."""
        self.model, self.recorder = model, freeze_kinks(model)
        self.params = dict(model.named_parameters())
        for n, p in self.params.items():
            p.requires_grad_(n in names)
        self.names, self.training = names, training
        self.observed = [self.params[n] for n in names]
        # every (module, attribute) slot holding each observed weight — a tied weight has several
        slots: dict[int, list[tuple[nn.Module, str]]] = {}
        for full_name, p in model.named_parameters(remove_duplicate=False):
            owner, _, attr = full_name.rpartition(".")
            slots.setdefault(id(p), []).append((model.get_submodule(owner), attr))
        self._slots = [slots[id(p)] for p in self.observed]
        # all-zero weights: the step is then STEP / ‖u‖
        self.observed_norm = _global_norm(self.observed) or 1.0
        self.entry = _entry_layer(model, input_shape)
        self._entry_output: torch.Tensor | None = None
        if self.entry is not None:
            self.entry.module.register_forward_hook(self._keep_entry_output)

    def _keep_entry_output(self, module: nn.Module, args, output: torch.Tensor) -> None:
        self._entry_output = output

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return list(_Differenced.apply(self, x, y))

    def gradients(self, x: torch.Tensor, y: torch.Tensor, mode: str, *, of_params: bool,
                  of_inputs: bool) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """(g over `names` or [], [∂L/∂(entry output, or x), ∇ᵧL or None] or []) at the
        model's current weights, with the kinks `mode`d."""
        soft = of_inputs and y.dtype.is_floating_point and y.requires_grad
        # x carries a graph whenever input gradients are wanted, so the entry layer's
        # output has one even when the layer's own weights are not observed
        x = x.detach().requires_grad_(of_inputs)
        y = y.detach().requires_grad_(soft)
        self.recorder.mode = mode
        try:
            with torch.enable_grad(), batchnorm_mode(self.model, self.training.batchnorm):
                loss = batch_loss(self.model(x), y)
                entry = [self._entry_output if self.entry is not None else x] if of_inputs else []
                inputs = (self.observed if of_params else []) + entry + ([y] if soft else [])
                grads = list(torch.autograd.grad(loss, inputs))
        finally:
            self.recorder.mode = "off"
            self._entry_output = None
        split = len(self.names) if of_params else 0
        return grads[:split], (grads[split:] + ([] if soft else [None])) if of_inputs else []

    @contextmanager
    def moved(self, u: list[torch.Tensor], h: float) -> Iterator[None]:
        """The observed weights replaced by θ + h·u for the duration (new tensors put
        in the modules' parameter slots, so θ itself is never written to)."""
        shifted = torch._foreach_add([p.detach() for p in self.observed], u, alpha=h)
        for slots, tensor in zip(self._slots, shifted):
            for owner, attr in slots:
                owner._parameters[attr] = tensor
        try:
            yield
        finally:
            for slots, param in zip(self._slots, self.observed):
                for owner, attr in slots:
                    owner._parameters[attr] = param

    def input_difference(self, base: torch.Tensor, shifted: torch.Tensor, u: list[torch.Tensor],
                         h: float, input_shape: torch.Size) -> torch.Tensor:
        """[∇ₓL(θ + h·u) − ∇ₓL(θ)] / h from the two passes' gradients at the entry
        layer's output (`_EntryLayer`), or at x itself."""
        if self.entry is None:
            return (shifted - base) / h
        pairs = [((shifted - base) / h, self.params[self.entry.weight_name].detach())]
        direction = dict(zip(self.names, u)).get(self.entry.weight_name)
        if direction is not None:  # else its weight is not observed and does not move
            pairs.append((shifted, direction))
        return self.entry.input_gradient(pairs, input_shape)


def _global_norm(tensors: list[torch.Tensor]) -> float:
    """‖concatenation of `tensors`‖ without concatenating them."""
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors))).detach())


class _Differenced(torch.autograd.Function):
    """forward: g(x) (recording kinks and the entry gradient when a backward will
    follow); backward: the difference of ∇ₓL (and ∇ᵧL for soft labels) along u."""

    @staticmethod
    def forward(ctx, engine: DifferencedGradient, x, y):
        if not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):  # a distance only
            return tuple(engine.gradients(x, y, "off", of_params=True, of_inputs=False)[0])
        engine.recorder.kinks = {}
        grads, ctx.base = engine.gradients(x, y, "record", of_params=True, of_inputs=True)
        ctx.engine, ctx.kinks = engine, engine.recorder.kinks
        ctx.save_for_backward(x, y)
        return tuple(grads)

    @staticmethod
    def backward(ctx, *grad_update):
        engine, (x, y) = ctx.engine, ctx.saved_tensors
        u = [g if g is not None else torch.zeros_like(p) for p, g in zip(engine.observed, grad_update)]
        u_norm = _global_norm(u)
        if u_norm == 0:
            return None, torch.zeros_like(x), (torch.zeros_like(y) if ctx.needs_input_grad[2] else None)
        h = STEP * engine.observed_norm / u_norm
        engine.recorder.kinks = ctx.kinks
        with engine.moved(u, h):
            shifted = engine.gradients(x, y, "replay", of_params=False, of_inputs=True)[1]
        grad_x = engine.input_difference(ctx.base[0], shifted[0], u, h, x.shape)
        grad_y = (shifted[1] - ctx.base[1]) / h if ctx.needs_input_grad[2] else None  # soft labels
        return None, grad_x, grad_y
