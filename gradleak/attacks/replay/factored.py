"""Linear layers' FedSGD gradients kept as their two factors.

On a batch of B rows a linear layer's weight gradient is G = Δᵀ A, with A the
layer's input (B × in) and Δ the loss's gradient at its output (B × out); its
bias gradient is Δ summed over the batch. The cosine distance to an observed
update T needs only

    ⟨G, T⟩ = Σ Δ ⊙ (A Tᵀ)          ‖G‖² = Σ (Δ Δᵀ) ⊙ (A Aᵀ)

(the second is Goodfellow's per-example-norm trick, Opacus's "ghost norm"), so
G — out × in, 0.2 M entries for an MLP's first layer — is never formed, and the
second derivative runs through B-row matrices instead of parameter-sized ones
(`python -m benchmarks optim` prints the cost of a matching iteration).

Exact, not an approximation; used by `UpdateSimulator` when every observed
tensor is the weight or bias of an `nn.Linear` called once on (B, in) rows and
the update is a FedSGD gradient. A `FactoredUpdate` is still a mapping from
names to tensors: reading an entry forms it, so every other distance and every
caller that transforms the update keep working unchanged. (`head_unroll` uses
the same low rank to replay FedAvg's local steps.)
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from ...fl.local import batch_loss


class FactoredUpdate(Mapping):
    """name → gradient; each observed linear layer held as its (Δ, A)."""

    def __init__(self, layers: dict[str, tuple[torch.Tensor, torch.Tensor]],
                 parts: dict[str, tuple[str, str]], target_squares: dict | None = None):
        self.layers = layers  # layer -> (Δ, A)
        self.parts = parts  # observed name -> (layer, "weight" | "bias")
        # name -> (target tensor, its squared norm): the observed update is the
        # same every iteration, so its norm is computed once per simulator
        self._target_squares = {} if target_squares is None else target_squares

    def __getitem__(self, name: str) -> torch.Tensor:
        layer, kind = self.parts[name]
        delta, inputs = self.layers[layer]
        return delta.t() @ inputs if kind == "weight" else delta.sum(0)

    def __iter__(self) -> Iterator[str]:
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)

    def target_squared_norm(self, name: str, target: torch.Tensor) -> float:
        cached = self._target_squares.get(name)
        if cached is None or cached[0] is not target:
            cached = self._target_squares[name] = (target, float(target.pow(2).sum()))
        return cached[1]


def factored_cosine(candidate: FactoredUpdate, target: Mapping[str, torch.Tensor],
                    weights: Mapping[str, float]) -> torch.Tensor:
    """`update_distance`'s (weighted) cosine, 1 − ⟨a,b⟩_w / (‖a‖_w ‖b‖_w + 1e-12),
    one layer at a time: with bias target t and weights w_W, w_b,
    ⟨·,T⟩ = Σ Δ ⊙ (w_W A Tᵀ + w_b t) and ‖·‖² = Σ (ΔΔᵀ) ⊙ (w_W AAᵀ + w_b) — the
    bias is the weight of a constant input 1."""
    by_layer: dict[str, dict[str, str]] = {}
    for name in target:
        layer, kind = candidate.parts[name]
        by_layer.setdefault(layer, {})[kind] = name
    dots, squares, target_sq = [], [], 0.0
    for layer, names in by_layer.items():
        delta, inputs = candidate.layers[layer]
        w_weight = float(weights.get(names.get("weight"), 1.0))
        w_bias = float(weights.get(names.get("bias"), 1.0))
        gram = delta @ delta.t()
        if "weight" in names:
            t_weight = target[names["weight"]]
            target_sq += w_weight * candidate.target_squared_norm(names["weight"], t_weight)
            inputs_gram = w_weight * (inputs @ inputs.t())
            if "bias" in names:
                t_bias = target[names["bias"]]
                target_sq += w_bias * candidate.target_squared_norm(names["bias"], t_bias)
                projected = torch.addmm(t_bias, inputs, t_weight.t(), beta=w_bias, alpha=w_weight)
                inputs_gram = inputs_gram + w_bias
            else:
                projected = w_weight * (inputs @ t_weight.t())
            dots.append((delta * projected).sum())
            squares.append((gram * inputs_gram).sum())
        else:  # a bias alone
            t_bias = target[names["bias"]]
            target_sq += w_bias * candidate.target_squared_norm(names["bias"], t_bias)
            dots.append(w_bias * (delta @ t_bias).sum())
            squares.append(w_bias * gram.sum())
    dot, square = torch.stack(dots).sum(), torch.stack(squares).sum()
    return 1 - dot / (square.sqrt() * target_sq ** 0.5 + 1e-12)


class FactoredGradient:
    """Candidate batch → `FactoredUpdate` of `model`'s linear layers (`names`).

    `model` is the simulator's private copy: forward hooks on its linear layers
    record their inputs and outputs, and autograd's gradient of the loss with
    respect to those outputs (kept differentiable) is each layer's Δ.
    """

    def __init__(self, model: nn.Module, names: list[str]):
        self.model = model
        self.layers = _observed_linears(model, names)
        self.parts = {name: tuple(name.rsplit(".", 1)) for name in names}
        self._recorded: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        self._target_squares: dict[str, tuple[torch.Tensor, float]] = {}
        for layer_name, module in self.layers.items():
            module.register_forward_hook(self._recorder(layer_name))

    def _recorder(self, layer_name: str):
        def record(module, args, output):
            if self._recorded is not None:
                self._recorded[layer_name] = (args[0], output)
        return record

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> FactoredUpdate:
        self._recorded = {}
        try:
            logits = self.model(x)
            recorded = self._recorded
        finally:
            self._recorded = None
        layers = list(self.layers)
        deltas = torch.autograd.grad(batch_loss(logits, y), [recorded[n][1] for n in layers],
                                     create_graph=True)
        factors = {n: (delta, recorded[n][0]) for n, delta in zip(layers, deltas)}
        return FactoredUpdate(factors, self.parts, self._target_squares)


def _observed_linears(model: nn.Module, names: list[str]) -> dict[str, nn.Linear]:
    modules = dict(model.named_modules())
    layers: dict[str, nn.Linear] = {}
    for name in names:
        layer_name, _, _ = name.rpartition(".")
        layers[layer_name] = modules[layer_name]
    return layers


def supports(model: nn.Module, names: list[str], input_shape: tuple[int, ...]) -> bool:
    """Whether every observed tensor is a linear layer's weight or bias, the model
    has no buffers (no batch norm whose mode or statistics would matter) and
    each observed layer runs exactly once, on (B, in) rows, in one forward pass
    (probed on a batch of two zero inputs), its parameters in no other slot."""
    if not names or any(True for _ in model.buffers()):
        return False
    modules = dict(model.named_modules())
    for name in names:
        layer_name, _, kind = name.rpartition(".")
        if not isinstance(modules.get(layer_name), nn.Linear) or kind not in ("weight", "bias"):
            return False
    # a weight tied into a second slot gets the sum of both slots' products
    slots = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    layers = _observed_linears(model, names)
    if any(slots[id(p)] > 1 for module in layers.values() for p in module.parameters()):
        return False
    calls: dict[str, list[int]] = {}
    handles = []
    for layer_name, module in layers.items():
        def note(module, args, _name=layer_name):
            calls.setdefault(_name, []).append(args[0].dim())
        handles.append(module.register_forward_pre_hook(note))
    try:
        with torch.no_grad():
            reference = next(model.parameters())
            model(torch.zeros((2, *input_shape), dtype=reference.dtype, device=reference.device))
    finally:
        for handle in handles:
            handle.remove()
    return all(calls.get(n) == [2] for n in layers)
