"""SPEAR (Dimitrov, Baader, Müller, Vechev, "SPEAR: Exact Gradient Inversion of Batches in
Federated Learning", NeurIPS 2024): exact recovery of a whole batch from the gradient of a dense
layer followed by ReLU, under an honest server.

The gradient of that layer has rank ≤ B; ReLU makes ∂L/∂Z sparse. Sampled subsets of r − 1 rows
of its low-rank factor give candidate directions, kept when they are as sparse as an example's
∂L/∂Z column and an input's ReLU pattern explains their zeros; B of them are chosen greedily, the
bias gradient fixes their scales, and the inputs follow exactly (gradleak.attacks.analytic.spear_core).
The result is verified: `converged` is True when the recovered inputs' ReLU pattern explains every
zero of the recovered ∂L/∂Z, which in every measured case meant every example exact.

Cost. A subset succeeds only when all its rows are inactive units of one example: about 2^-(B−1)
of uniform draws (SPEAR's sampling), far more with the guided draws of spear_core. The draws
follow the auditor's budget ladder (`samples` per rung, doubling, resuming), and batches above
`max_batch` are refused. On a layer on the input the inputs themselves come back; behind
convolutions they are the layer's input features, which are then inverted through the known
extractor by optimisation (gradleak.solvers.features), as the Cocktail Party attack does.
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import GradleakError
from ...fl.training import TrainingSpec
from ...options import check
from ...solvers.features import FeatureExtractor, FeatureInversionOptions, invert_features
from ...threat import Observation
from ..base import Attack, AttackContext, Reconstruction, check_result
from ..replay.labels import recover_labels
from . import spear_core as core

CHUNK = 1024  # row subsets drawn per batched step


@dataclass
class SPEAROptions:
    samples: int = field(default=65536, metadata={"range": (1024, 1 << 26)})  # row subsets drawn at the first rung
    max_batch: int = field(default=25, metadata={"range": (1, 64)})  # larger batches are refused (cost ~2^B)
    min_sparsity: float = field(default=0.05, metadata={"range": (0.0, 0.9)})  # zeros a direction needs, beyond r − 1
    layer: str = ""  # the dense layer to invert (module name); "" = the first one followed by ReLU
    feature_steps: int = 1000  # behind convolutions: Adam steps inverting the recovered features
    feature_lr: float = 0.05
    feature_tv: float = 0.01

    def __post_init__(self):
        check(self.samples >= 1, "attack 'spear': samples must be >= 1")
        check(self.max_batch >= 1, "attack 'spear': max_batch must be >= 1")
        check(0 <= self.min_sparsity < 1, "attack 'spear': min_sparsity must be in [0, 1)")
        check(self.feature_steps >= 1, "attack 'spear': feature_steps must be >= 1")
        self.inversion()

    def inversion(self) -> FeatureInversionOptions:
        return FeatureInversionOptions(self.feature_steps, self.feature_lr, self.feature_tv)


@dataclass(frozen=True)
class DenseReLU:
    name: str
    module: nn.Linear
    on_input: bool  # sees the flattened input (else features behind convolutions)


def locate_dense_relu(model: nn.Module, input_shape: tuple[int, ...], name: str = "",
                      attack: str = "spear") -> DenseReLU:
    """The first nn.Linear followed by a ReLU, or the one named (`attack` names who asks, in the
    refusals). Followed means: the next module in registration order (the order gradleak's
    sequential models run in) is an nn.ReLU, or, for a ReLU applied in `forward` (`F.relu`, as
    apps write it), a later module of a probe forward pass receives exactly ReLU of its output."""
    leaves = [(n, m) for n, m in model.named_modules() if not list(m.children())]
    functional: set[str] | None = None
    behind = False
    for index, (layer_name, module) in enumerate(leaves):
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            behind = True
        if not isinstance(module, nn.Linear) or (name and layer_name != name):
            continue
        follows = leaves[index + 1][1] if index + 1 < len(leaves) else None
        if not isinstance(follows, nn.ReLU):
            if functional is None:
                functional = _relu_in_forward(model, input_shape)
            if layer_name not in functional:
                if name:
                    raise GradleakError(f"attack '{attack}': layer '{name}' is not followed by a ReLU")
                continue
        if module.bias is None:
            raise GradleakError(f"attack '{attack}': layer '{layer_name}' has no bias, whose gradient "
                                "it needs for the examples' scales")
        on_input = not behind and module.in_features == math.prod(input_shape)
        return DenseReLU(layer_name, module, on_input)
    if name:
        raise GradleakError(f"attack '{attack}': the model has no linear layer '{name}'")
    raise GradleakError(f"attack '{attack}' needs a dense layer followed by ReLU (e.g. model mlp); this model has none")


def _relu_in_forward(model: nn.Module, input_shape: tuple[int, ...]) -> set[str]:
    """The nn.Linear layers whose output some later module receives as exactly its ReLU, on one
    probe forward pass of a copy in eval mode (dropout off); none when the probe cannot run."""
    calls = _probe(model, input_shape)
    return {name for name, receivers in _rectified_receivers(calls).items() if receivers}


def head_after(model: nn.Module, input_shape: tuple[int, ...], layer_name: str) -> nn.Linear | None:
    """The dense layer that alone takes `layer_name`'s ReLU output (through dropout or a flatten at
    most), found by a probe forward pass; None when another module takes it too or the probe cannot
    run. Then each example's ∂L/∂Z at `layer_name` is Hᵀδ masked by its ReLU pattern, δ the head's
    output gradient: on its nonzero units, in the span of the head's k weight rows."""
    receivers = _rectified_receivers(_probe(model, input_shape)).get(layer_name, [])
    passing = (nn.Dropout, nn.Identity, nn.Flatten)
    heads = [n for n, m in receivers if isinstance(m, nn.Linear)]
    if len(heads) != 1 or not all(isinstance(m, (nn.Linear, *passing)) for _, m in receivers):
        return None
    head = dict(model.named_modules()).get(heads[0])
    return head if isinstance(head, nn.Linear) else None


def _probe(model: nn.Module, input_shape: tuple[int, ...]
           ) -> list[tuple[str, nn.Module, torch.Tensor | None, torch.Tensor | None]]:
    """One forward pass of a copy in eval mode: per leaf module call, its name, the module, its
    first input and (for nn.Linear) a copy of its output; empty when the probe cannot run."""
    try:
        probe = copy.deepcopy(model).eval()
    except Exception:  # noqa: BLE001  (a model that cannot be copied is not run here)
        return []
    calls: list[tuple[str, nn.Module, torch.Tensor | None, torch.Tensor | None]] = []

    def record(layer_name):
        def hook(module, inputs, output):
            first = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
            # a copy: an in-place ReLU after the layer would otherwise rewrite the output kept here
            calls.append((layer_name, module, first, output.clone() if isinstance(module, nn.Linear) else None))
        return hook

    for layer_name, module in probe.named_modules():
        if not list(module.children()):
            module.register_forward_hook(record(layer_name))
    x = torch.randn((2, *input_shape), generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            probe(x)
    except Exception:  # noqa: BLE001  (a model this probe cannot feed: the registration order decides)
        return []
    return calls


def _rectified_receivers(calls) -> dict[str, list[tuple[str, nn.Module]]]:
    """Per nn.Linear call with negative outputs, the later module calls whose input is exactly
    its ReLU (element for element, or flattened)."""
    found: dict[str, list[tuple[str, nn.Module]]] = {}
    for index, (layer_name, _, _, output) in enumerate(calls):
        if output is None or not bool((output < 0).any()):
            continue
        rectified = output.clamp(min=0)
        found[layer_name] = [(name, module) for name, module, later, _ in calls[index + 1:]
                             if later is not None and later.numel() == rectified.numel()
                             and torch.equal(later.reshape(rectified.shape), rectified)]
    return found


class SPEAR(Attack):
    """SPEAR: exact batch inversion of a dense+ReLU layer's gradient by sampling sparse directions."""

    name = "spear"
    Options = SPEAROptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels"})
    iterative = True  # more draws can complete a recovery; `converged` says when it is verified
    budgets = {"quick": {"samples": 16384}, "thorough": {"samples": 262144}}

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: locate_dense_relu(model, input_shape, self.options.layer)))

    def budget(self) -> int | None:
        return int(self.options.samples)

    def blind_to(self, training: TrainingSpec) -> str | None:
        if not training.is_fedsgd:
            return ("reads a multi-step update as one gradient: exact under FedSGD only, "
                    "approximate at small learning rates")
        return None

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        return next(iter(self.rungs(obs, ctx)))

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        started = time.perf_counter()
        for layer, dec, sampler, solution in self.search(obs, ctx):
            yield self._result(obs, ctx, layer, dec, sampler, solution, obs.batch_size,
                               time.perf_counter() - started)

    def layer_inputs(self, obs: Observation, ctx: AttackContext) -> torch.Tensor | None:
        """The recovered inputs of the attacked layer at the first rung (features behind
        convolutions), one row per example, or None when the directions were not all found."""
        _, _, _, solution = next(iter(self.search(obs, ctx)))
        return None if solution is None else core.settled(solution.inputs)

    def search(self, obs: Observation, ctx: AttackContext
               ) -> Iterator[tuple[DenseReLU, core.Decomposition, core.Sampler, core.Solution | None]]:
        """The draws, rung by rung: `samples` at the first, doubling, each resuming the last and
        stopping early once a solution is verified."""
        opt = self.options
        layer = locate_dense_relu(obs.model, obs.input_shape, opt.layer)
        batch = obs.batch_size
        if batch > opt.max_batch:
            raise GradleakError(f"attack 'spear': batch {batch} is beyond the {opt.max_batch} it supports "
                                "(its draws grow about 2^batch; raise max_batch to try)")
        grads = obs.update.as_gradient()
        g_weight, g_bias = grads.get(f"{layer.name}.weight"), grads.get(f"{layer.name}.bias")
        if g_weight is None or g_bias is None:
            raise GradleakError(f"attack 'spear': the update has no gradient for layer '{layer.name}'")
        if layer.module.in_features < batch:
            raise GradleakError(f"attack 'spear': layer '{layer.name}' sees {layer.module.in_features} features, "
                                f"fewer than the batch of {batch}: its gradient cannot separate them")
        dec = core.decompose(g_weight, g_bias, layer.module.weight.detach(), layer.module.bias.detach(), batch)
        if dec.left.shape[0] < dec.rank + 2:
            raise GradleakError(f"attack 'spear': only {dec.left.shape[0]} units of layer '{layer.name}' saw the "
                                f"batch, too few for {dec.rank} examples")
        sampler = core.Sampler(dec, core.inactivity_estimate(dec, g_weight), core.min_zeros(dec, opt.min_sparsity),
                               ctx.generator(31), self._head_rows(obs, layer, dec))
        solution: core.Solution | None = None
        target = opt.samples
        while True:
            while sampler.drawn < target and not (solution is not None and solution.agreement >= 1.0):
                # with r − 1 directions the last one comes from a scan (core.complete_last)
                if sampler.draw(min(CHUNK, target - sampler.drawn)) and len(sampler.pool) >= dec.rank - 1:
                    solution = core.select(sampler) or solution
                if ctx.progress is not None:
                    ctx.progress(sampler.drawn, target, float(len(sampler.pool)))
            yield layer, dec, sampler, solution
            target *= 2

    @staticmethod
    def _head_rows(obs: Observation, layer: DenseReLU, dec: core.Decomposition) -> torch.Tensor | None:
        """The weight rows of the one dense layer that takes the ReLU output, on the live units, when
        they constrain a column: at most a quarter as many as the live units."""
        head = head_after(obs.model, obs.input_shape, layer.name)
        live = int(dec.left.shape[0])
        if head is None or head.in_features != len(dec.live) or 4 * head.out_features > live:
            return None
        return head.weight.detach().double().T[dec.live]

    def _result(self, obs: Observation, ctx: AttackContext, layer: DenseReLU, dec: core.Decomposition,
                sampler: core.Sampler, solution: core.Solution | None, batch: int, seconds: float) -> Reconstruction:
        verified = solution is not None and solution.agreement >= 1.0
        extras = {"layer": layer.name, "rank": dec.rank, "candidates": len(sampler.pool),
                  "relu_checks": sampler.checks, "seconds": round(seconds, 3),
                  "relu_agreement": None if solution is None else round(solution.agreement, 6)}
        if dec.rank < batch:
            extras["rank_note"] = (f"the gradient has rank {dec.rank} < batch {batch}: "
                                   "repeated (or too few distinct) examples")
        if solution is None:
            # fewer than r directions found: no input is determined; a placeholder batch of zeros
            rows = torch.zeros(dec.rank, layer.module.in_features, dtype=torch.float64)
            extras["found"] = sum(1 for v in sampler.pool.verdicts if v)
        else:
            rows = core.settled(solution.inputs)
        labels = None
        if layer.on_input:
            x = obs.kind.clamp(rows.float().reshape(-1, *obs.input_shape))
            if solution is not None:
                labels = assign_labels(obs, layer, x, solution, dec, batch)
        else:
            extract = FeatureExtractor(obs.model, layer.name)
            extras["feature_dim"] = int(rows.shape[1])
            x = invert_features(extract, rows.float().clamp_min(0), obs.input_shape, self.options.inversion(),
                                generator=ctx.generator(29))
        if labels is None:
            labels = recover_labels(obs, "auto", ctx.generator(17))
        return Reconstruction(inputs=x, labels=labels, iterations=sampler.drawn, converged=verified, extras=extras)


def assign_labels(obs: Observation, layer: DenseReLU, x: torch.Tensor, solution: core.Solution,
                  dec: core.Decomposition, batch: int) -> torch.Tensor | None:
    """Each recovered example's label: the class whose cross-entropy gradient at the layer's output,
    run through the server's model, reproduces the recovered ∂L/∂Z column (1/B of the mean loss).
    None when no class reproduces some column (another loss, a multi-step update)."""
    captured: dict[str, torch.Tensor] = {}

    def keep(_module, _inputs, output):
        output.retain_grad()
        captured["z"] = output

    model = obs.model
    handle = layer.module.register_forward_hook(keep)
    errors = []
    try:
        for label in range(obs.num_classes):
            targets = torch.full((len(x),), label, dtype=torch.long)
            with torch.enable_grad():
                logits = _forward_without_side_effects(model, x)
                F.cross_entropy(logits, targets, reduction="sum").backward(inputs=[captured["z"]])
            delta = captured["z"].grad.detach().double()[:, dec.live] / batch
            errors.append((delta - solution.delta.T).norm(dim=1) / solution.delta.norm(dim=0).clamp_min(1e-30))
    finally:
        handle.remove()
    error = torch.stack(errors, 1)  # examples × classes
    best = error.min(1)
    if bool((best.values > 1e-3).any()):
        return None
    return best.indices


def _forward_without_side_effects(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output on x, leaving its buffers (batch-norm running statistics) as they were."""
    saved = {n: b.clone() for n, b in model.named_buffers()}
    try:
        return model(x)
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
