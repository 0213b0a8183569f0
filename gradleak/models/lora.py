"""LoRA: low-rank adapters on a model's attention input projections (Hu, Shen, Wallis,
Allen-Zhu, Li, Wang, Wang, Chen, "LoRA: Low-Rank Adaptation of Large Language Models",
ICLR 2022).

An adapted linear layer computes W x + b + (α / r) · B A x with the base weight W and bias b
frozen, A (r × in) drawn as `nn.Linear` draws a weight (Kaiming-uniform, as peft does) and
B (out × r) zero: at the start the adapted model computes exactly what the base model does,
and only A and B are trained, so a client's update holds only the adapter tensors. The
gradients are dL/dA = (α / r) · Bᵀ Σ δ xᵀ (rows in the span of the layer's inputs x, zero
while B = 0) and dL/dB = (α / r) · Σ δ (A x)ᵀ (rows in the span of the projected inputs A x).

`apply_lora` adapts the attention input projections: gradleak's GPT-2 fuses Q, K and V in
one linear layer per block (`attn.qkv`), which gets one adapter; models that name separate
projections (`query`/`key`/`value`, `q_proj`/`k_proj`/`v_proj`) get one per projection.
Every other parameter is frozen (requires_grad False).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import GradleakError

# the last component(s) of the module names apply_lora adapts: attention input projections
LORA_TARGETS = ("attn.qkv", "query", "key", "value", "q_proj", "k_proj", "v_proj")
ADAPTER_NAMES = ("lora_A", "lora_B")


class LoRALinear(nn.Linear):
    """A linear layer with a low-rank adapter: W x + b + (α / r) · B A x (see the module doc).
    `weight` and `bias` keep their names (frozen); the adapter is `lora_A`, `lora_B`."""

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float | None = None,
                 bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if not 1 <= rank <= min(in_features, out_features):
            raise GradleakError(f"lora: rank must be within 1..{min(in_features, out_features)} "
                                f"for a {in_features} → {out_features} layer, got {rank}")
        self.rank = rank
        self.alpha = float(alpha if alpha is not None else rank)
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, alpha: float | None = None,
                    generator: torch.Generator | None = None) -> "LoRALinear":
        """`linear` with an adapter: its weight and bias copied, A drawn from `generator`."""
        weight = linear.weight
        out = cls(linear.in_features, linear.out_features, rank, alpha, bias=linear.bias is not None,
                  device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            out.weight.copy_(weight)
            if linear.bias is not None:
                out.bias.copy_(linear.bias)
            # nn.Linear's (and peft's) Kaiming-uniform draw, from the given generator
            bound = 1.0 / math.sqrt(linear.in_features)
            out.lora_A.copy_((torch.rand(out.lora_A.shape, generator=generator, dtype=torch.float64) * 2 - 1)
                             .mul_(bound).to(out.lora_A))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.scaling * F.linear(F.linear(x, self.lora_A), self.lora_B)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha:g}"


def lora_targets(model: nn.Module) -> list[str]:
    """Names of the linear layers `apply_lora` adapts (attention input projections)."""
    return [name for name, module in model.named_modules()
            if type(module) is nn.Linear and any(name == t or name.endswith("." + t) for t in LORA_TARGETS)]


def apply_lora(model: nn.Module, rank: int, alpha: float | None = None, seed: int = 0,
               b_std: float = 0.0) -> nn.Module:
    """Adapt `model` in place (and return it): every attention input projection becomes a
    `LoRALinear` of rank `rank`, every other parameter is frozen. A is drawn from a generator
    seeded with `seed`; B is zero (Hu et al.'s initialisation), or, with `b_std` > 0, drawn
    Gaussian with that standard deviation: adapters part-way through a fine-tuning, whose A
    gradient is no longer zero."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise GradleakError(f"--lora takes the adapters' rank, a whole number ≥ 1, got {rank!r}")
    if alpha is not None and not (alpha > 0 and math.isfinite(alpha)):
        raise GradleakError(f"--lora-alpha must be a positive number, got {alpha}")
    if not (b_std >= 0 and math.isfinite(b_std)):
        raise GradleakError(f"--lora-b-std must be a number ≥ 0, got {b_std}")
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise GradleakError("lora: the model already has adapters")
    names = lora_targets(model)
    if not names:
        raise GradleakError(f"--lora adapts attention Q/K/V projections (gpt2); {type(model).__name__} has no "
                            f"linear layer named {', '.join(LORA_TARGETS)}")
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        param.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        adapted = LoRALinear.from_linear(getattr(parent, child), rank, alpha, generator)
        if b_std:
            with torch.no_grad():
                adapted.lora_B.copy_(torch.randn(adapted.lora_B.shape, generator=generator,
                                                 dtype=torch.float64).mul_(b_std).to(adapted.lora_B))
        setattr(parent, child, adapted)
    return model


def is_adapted(model: nn.Module) -> bool:
    """The model carries LoRA adapters."""
    return any(isinstance(m, LoRALinear) for m in model.modules())


def is_adapter_name(name: str) -> bool:
    """A parameter name of an adapter tensor (`...lora_A` / `...lora_B`)."""
    return name.rpartition(".")[2] in ADAPTER_NAMES
