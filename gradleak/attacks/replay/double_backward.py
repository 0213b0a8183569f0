"""Convolution and batch-norm layers with a cheap second derivative.

A gradient-matching iteration differentiates a gradient: the simulated update
is built with `create_graph=True` and the distance is back-propagated through
that first backward pass. PyTorch's generic double backward of `conv2d`
(`_convolution_double_backward`) and of training-mode batch norm (a long
composite of element-wise ops) cost several times the first backward. Here the
first backward of each layer is itself an `autograd.Function` whose backward is
written out: for y = conv(x, W) + b with incoming gradient g,

    first backward:   gx = convᵀ(g, W),  gW = conv_w(g, x),  gb = Σ g
    its adjoint:      ḡ  = conv(ḡx, W) + conv(x, ḡW) + ḡb
                      x̄  = convᵀ(g, ḡW)          W̄ = conv_w(g, ḡx)

— three convolutions instead of PyTorch's slower general path — and batch norm's
adjoint is collapsed to per-channel coefficients so it costs about ten passes
over the activations.

`make_twice_differentiable(model)` swaps the classes of the `Conv2d` and
`BatchNorm` modules of a private copy in place (hooks and parameter names are
kept). Second-order gradients reach the layer inputs and the incoming gradient;
they reach a weight only when that weight is itself computed from the inputs
(the later local steps of an unrolled FedAvg update) — never a leaf parameter,
which gradient-matching attacks do not optimise. Layers also skip gradients the
running backward pass will not use (the first layer's input gradient while the
update is simulated, the leaf weights' gradients under `backward(inputs=...)`),
and convolutions below `MIN_CONV_MACS` keep PyTorch's own path. Equality with
PyTorch's second derivative is tested in `tests/attacks/replay/test_double_backward.py`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.autograd.graph import get_gradient_edge

aten = torch.ops.aten


def _second_order(weight: torch.Tensor | None) -> torch.Tensor | None:
    """The weight as seen by the backward pass: a leaf parameter is detached so
    no second-order gradient is spent on it (see the module doc)."""
    if weight is None or weight.grad_fn is not None:
        return weight
    return weight.detach()


def _will_receive_grad(tensor: torch.Tensor) -> bool:
    """Whether the running backward pass needs a gradient for `tensor`. A custom
    Function's `needs_input_grad` is fixed at forward time; built-in layers skip
    gradients the engine will not use (`autograd.grad(..., inputs)`,
    `backward(inputs=...)`), and this lets these layers do the same: the first
    layer's input gradient in the simulated step, the leaf weights' gradients
    when the distance is back-propagated to the candidate only."""
    if not tensor.requires_grad:
        return False
    try:
        return torch._C._will_engine_execute_node(get_gradient_edge(tensor).node)
    except RuntimeError:  # a leaf during autograd.grad(): PyTorch cannot tell, so compute it
        return True


class _ConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        mask = (needs[0] and _will_receive_grad(x), needs[1] and _will_receive_grad(weight),
                needs[2] and ctx.has_bias)
        if not any(mask):
            return None, None, None, None, None, None, None
        gx, gw, gb = _ConvBackwardFn.apply(g, x, _second_order(weight), ctx.geometry, mask)
        return gx, gw, gb, None, None, None, None


class _ConvBackwardFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, x, weight, geometry, mask):
        stride, padding, dilation, groups = geometry
        ctx.geometry = geometry
        ctx.save_for_backward(g, x, weight)
        bias_sizes = [weight.shape[0]] if mask[2] else None
        return aten.convolution_backward(g, x, weight, bias_sizes, stride, padding, dilation, False,
                                         [0] * len(stride), groups, list(mask))

    @staticmethod
    @once_differentiable
    def backward(ctx, ggx, ggw, ggb):
        g, x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geometry
        zeros = [0] * len(stride)
        gg = None
        if ggx is not None:
            gg = F.conv2d(ggx, weight, None, stride, padding, dilation, groups)
        if ggw is not None:
            term = F.conv2d(x, ggw, None, stride, padding, dilation, groups)
            gg = term if gg is None else gg.add_(term)
        if ggb is not None:
            term = ggb.view(1, -1, 1, 1)
            gg = term.expand_as(g).clone() if gg is None else gg.add_(term)
        x_bar = w_bar = None
        if ggw is not None and ctx.needs_input_grad[1]:
            x_bar = aten.convolution_backward(g, x, ggw, None, stride, padding, dilation, False, zeros,
                                              groups, [True, False, False])[0]
        if ggx is not None and ctx.needs_input_grad[2]:
            w_bar = aten.convolution_backward(g, ggx, weight, None, stride, padding, dilation, False, zeros,
                                              groups, [False, True, False])[1]
        return gg, x_bar, w_bar, None, None


class _BatchNormFn(torch.autograd.Function):
    """Training-mode batch norm on batch statistics; running statistics, when
    given, are updated in place as `F.batch_norm` does."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
        y, mean, invstd = aten.native_batch_norm(x, weight, bias, running_mean, running_var, True,
                                                 momentum, eps)[:3]
        ctx.eps = eps
        ctx.save_for_backward(x, weight, mean, invstd)
        return y

    @staticmethod
    def backward(ctx, g):
        x, weight, mean, invstd = ctx.saved_tensors
        gx, gw, gb = _BatchNormBackwardFn.apply(g, x, _second_order(weight), mean, invstd, ctx.eps)
        return gx, gw, gb, None, None, None, None


class _BatchNormBackwardFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, x, weight, mean, invstd, eps):
        gx, gw, gb = aten.native_batch_norm_backward(g, x, weight, None, None, mean, invstd, True, eps,
                                                      [True, True, True])
        ctx.save_for_backward(g, x, weight, mean, invstd, gw, gb)
        return gx, gw, gb

    @staticmethod
    @once_differentiable
    def backward(ctx, ggx, ggw, ggb):
        # With x̂ = (x−μ)σ⁻¹, a = γσ⁻¹ and per-channel means m_g = mean(g),
        # m_gx̂ = mean(g·x̂), the first backward is gx = a(g − m_g − x̂·m_gx̂),
        # gγ = n·m_gx̂, gβ = n·m_g. Its adjoint, with μ and σ depending on x,
        # collapses to per-channel coefficients times g, ḡx and x̂.
        g, x, weight, mean, invstd, gw, gb = ctx.saved_tensors
        dims = [0, *range(2, g.dim())]
        shape = [1, -1] + [1] * (g.dim() - 2)
        n = g.numel() // g.shape[1]
        xhat = torch.addcmul((-mean * invstd).view(shape), x, invstd.view(shape))
        a = weight * invstd
        m_g, m_gx = gb / n, gw / n
        zero = torch.zeros_like(m_g)
        ggw = zero if ggw is None else ggw
        ggb = zero if ggb is None else ggb
        if ggx is not None:
            m_u = ggx.sum(dims) / n
            m_ux = (ggx * xhat).sum(dims) / n
            m_ug = (ggx * g).sum(dims) / n
        else:
            m_u = m_ux = m_ug = zero
        c1 = ggw - a * m_ux
        g_bar = torch.addcmul((ggb - a * m_u).view(shape), xhat, c1.view(shape))
        if ggx is not None:
            g_bar.addcmul_(ggx, a.view(shape))
        s = n * (m_ug - m_g * m_u - m_gx * m_ux)  # Σ ḡx·(g − m_g − x̂·m_gx̂)
        sigma_bar = -a * invstd * s  # a = γ/σ, ∂a/∂σ = −a/σ
        # x̂-adjoint xb = c1·g − a·m_gx̂·ḡx; its means, then back through μ and σ
        mean_xb = c1 * m_g - a * m_gx * m_u
        mean_xb_xhat = c1 * m_gx - a * m_gx * m_ux
        x_bar = torch.addcmul((-invstd * mean_xb).view(shape), xhat,
                              (sigma_bar / n - invstd * mean_xb_xhat).view(shape))
        x_bar.addcmul_(g, (invstd * c1).view(shape))
        if ggx is not None:
            x_bar.addcmul_(ggx, (-invstd * a * m_gx).view(shape))
        w_bar = invstd * s if ctx.needs_input_grad[2] else None
        return g_bar, x_bar, w_bar, None, None, None


# Below about this many multiply-adds per call, a layer keeps PyTorch's own conv:
# the Python-level autograd Functions cost ~0.1 ms per layer and iteration, more
# than the cheaper second derivative saves (LeNet's layers are 0.5-1.4 M at batch
# 8 and ran ~25 % slower with the Functions; ConvNet's and ResNet-20's are >= 19 M).
MIN_CONV_MACS = 5_000_000


def _conv_macs(x: torch.Tensor, weight: torch.Tensor, stride: tuple[int, ...]) -> int:
    if x.dim() != 4:
        return 0
    return x.shape[0] * weight.numel() * (x.shape[-2] // stride[0]) * (x.shape[-1] // stride[1])


def _conv_forward(self: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    if _conv_macs(x, self.weight, self.stride) < MIN_CONV_MACS:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
    return _ConvFn.apply(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def _batchnorm_forward(self: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> torch.Tensor:
    if self.training or self.running_mean is None:
        # the momentum bookkeeping of nn.BatchNorm's forward
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        running = (self.running_mean, self.running_var) if self.training else (None, None)
        return _BatchNormFn.apply(x, self.weight, self.bias, *running, momentum, self.eps)
    return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


_SUBCLASSES: dict[type, type] = {}


def _twice_differentiable_class(cls: type, forward) -> type:
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type(f"TwiceDifferentiable{cls.__name__}", (cls,), {"forward": forward})
    return _SUBCLASSES[cls]


def make_twice_differentiable(model: nn.Module) -> nn.Module:
    """Give `model`'s plain Conv2d and affine BatchNorm layers the cheap double
    backward, in place; other layers keep PyTorch's. Returns `model`."""
    for module in model.modules():
        cls = type(module)
        if cls is nn.Conv2d and module.padding_mode == "zeros" and isinstance(module.padding, tuple):
            module.__class__ = _twice_differentiable_class(cls, _conv_forward)
        elif cls in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d) and module.affine:
            module.__class__ = _twice_differentiable_class(cls, _batchnorm_forward)
    return model
