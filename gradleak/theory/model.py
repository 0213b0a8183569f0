"""The two-layer network of Liu et al. §3 (App. B, D) and its gradient as a
differentiable function of the client's data S.

f(x) = Σ_j a_j σ(w_j·x),  a_j = 1/m,  w_j ~ N(0, I_d);  L = ½ Σ_i (y_i − f(x_i))²
(the ½ drops the factor 2 of the square loss, as WLL do), so
∇_{a_j}L = Σ_i r_i σ(w_j·x_i) and ∇_{w_j}L = Σ_i r_i a_j σ'(w_j·x_i) x_i with r_i = f(x_i) − y_i.
The observed gradient is the flat vector [∇_a L (m,), ∇_W L (m·d,)].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch

from ..errors import GradleakError

Activation = Literal["linear", "square_cube", "tanh", "sigmoid", "relu"]
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "linear": lambda z: z,
    # σ(z) = z² + z³ is WLL's experimental activation: E σ'' = 2 and E σ''' = 6 are both non-zero,
    # which the span step (needs E σ'') and the third-order tensor (needs E σ''') require.
    "square_cube": lambda z: z * z + z * z * z,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
}


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise GradleakError(f"unknown activation '{name}'; choose from {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


@dataclass
class TwoLayerNet:
    """Weights in the paper's mean-field scaling: a (m,) = 1/m, W (m, d) rows w_j ~ N(0, I_d)."""

    a: torch.Tensor
    W: torch.Tensor
    activation: str = "square_cube"

    @property
    def width(self) -> int:
        return self.W.shape[0]

    @property
    def dim(self) -> int:
        return self.W.shape[1]

    @property
    def num_params(self) -> int:
        return self.width * (self.dim + 1)


def random_network(d: int, m: int, activation: str = "square_cube", seed: int = 0,
                   dtype: torch.dtype = torch.float64) -> TwoLayerNet:
    if d < 1 or m < 1:
        raise GradleakError(f"need d ≥ 1 and m ≥ 1 (got d={d}, m={m})")
    activation_fn(activation)
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(m, d, generator=gen, dtype=dtype)
    a = torch.full((m,), 1.0 / m, dtype=dtype)
    return TwoLayerNet(a=a, W=W, activation=activation)


def random_data(d: int, batch_size: int, seed: int = 0, label: float = -1.0,
                dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """B unit-norm Gaussian directions (Assumption B.1: ||x_i|| = 1, linearly independent w.p. 1).

    All labels equal `label`: with σ = z²+z³ and ||x|| = 1, r*_i = E σ(Z) − y_i = 1 − y_i, so y = −1
    gives r*_i = 2 for every sample (κ = 1 in WLL Claim 5.4; y = +1 would make r*_i = 0, unidentifiable).
    """
    if batch_size < 1:
        raise GradleakError(f"batch size must be ≥ 1 (got {batch_size})")
    if batch_size > d:
        raise GradleakError(f"batch size {batch_size} > d={d}: the tensor attack needs B ≤ d independent inputs")
    gen = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(batch_size, d, generator=gen, dtype=dtype)
    x = x / x.norm(dim=1, keepdim=True)
    y = torch.full((batch_size,), float(label), dtype=dtype)
    return x, y


def gradient_at(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                activation: str) -> torch.Tensor:
    """Flat gradient [∇_a L, ∇_W L] of L = ½ Σ_i (f(x_i) − y_i)², differentiable in x (and a, W)."""
    sigma = activation_fn(activation)

    def loss(a_: torch.Tensor, W_: torch.Tensor) -> torch.Tensor:
        residual = sigma(x @ W_.T) @ a_ - y
        return 0.5 * (residual * residual).sum()

    grad_a, grad_W = torch.func.grad(loss, argnums=(0, 1))(a, W)
    return torch.cat([grad_a, grad_W.reshape(-1)])


def gradient(net: TwoLayerNet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return gradient_at(net.a, net.W, x, y, net.activation)


def split_gradient(flat: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat gradient → (∇_a (m,), ∇_W (m, d))."""
    return flat[:m], flat[m:].reshape(m, -1)

