"""Defense interface and the chain that applies defenses at their real place.

A defense acts at one or more of these places, in the order a client meets them:
  model    – the architecture both sides agree on (PRECODE, dropout layers)
  data     – the client's batch before training (MixUp, InstaHide)
  gradient – every local step's gradient (DP-SGD, FedCDP, Soteria)
  update   – the final update before upload (noise, clipping, pruning, quantization, …)
Secure aggregation is handled by the experiment, which adds other clients.
"""
from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import GradleakError
from ..fl import TrainingSpec, compute_update
from ..fl.local import StepGradient
from ..fl.places import DefenseContext, NoDefense
from ..fl.update import Update


class Defense:
    """Base class: override the hooks for the places the defense acts at."""

    name: ClassVar[str] = ""
    Options: ClassVar[type | None] = None
    places: ClassVar[tuple[str, ...]] = ("update",)
    # Number of other clients the server's view is summed with (secure aggregation).
    aggregate_clients: int = 1
    # True when the update's exact zeros are entries the client did not send
    # (sparsifying compressors); a server that knows the protocol then compares
    # only the sent entries.
    withholds_entries: bool = False
    # The option that orders this defense's settings by strength, and its direction: +1 when a
    # larger value is stronger, -1 when a smaller one is (the guard's defense ladder checks
    # that each rung is stronger than the one below); None: its settings have no such order.
    strength: ClassVar[tuple[str, int] | None] = None

    def __init__(self, options: Any = None):
        self.options = options if options is not None else (self.Options() if self.Options else None)

    def strength_axis(self) -> tuple[str, int] | None:
        """The strength order of this setting: `strength`, or None where these options leave
        the defense without one."""
        return self.strength

    def two_layer(self, view: Any) -> Any:
        """This defense in the two-layer analysis of `gradleak.theory` (Liu et al.): the map of the
        client's data to what the server observes, built from `view` (a
        `gradleak.theory.defenses.TwoLayerView`: the network, the true batch, its gradients) and
        returned as `view.result(observe, ...)`. A defense that does not override this is outside
        the analysis."""
        raise GradleakError(f"the two-layer analysis does not cover defense '{self.name}'")

    def check_two_layer(self) -> None:
        """Raise GradleakError when these options are outside the two-layer analysis."""

    @classmethod
    def in_two_layer_analysis(cls) -> bool:
        """True when the class gives its two-layer map (`two_layer`), so `gradleak bound` and the
        theory study take it by name."""
        return cls.two_layer is not Defense.two_layer

    def transform_model(self, model: nn.Module) -> nn.Module:
        return model

    def transform_batch(self, x: torch.Tensor, y: torch.Tensor, ctx: DefenseContext):
        return x, y

    def wrap_step_gradient(self, inner: StepGradient, ctx: DefenseContext) -> StepGradient:
        return inner

    def transform_update(self, update: Update, ctx: DefenseContext) -> Update:
        return update

    def privacy(self, *, sample_rate: float, steps: int, delta: float) -> float | None:
        """ε spent by `steps` noisy steps at `sample_rate`, for DP defenses."""
        return None

    def rdp(self, *, sample_rate: float, steps: int, orders: list[float]) -> list[float] | None:
        """Rényi DP ε at each order of `orders` spent by `steps` noisy steps at `sample_rate`, for
        DP defenses (None otherwise): what the reconstruction-robustness bound reads."""
        return None

    def __repr__(self) -> str:
        return f"{self.name}({self.options})"


class DefenseChain(NoDefense):
    """Defenses in the order given on the command line, at the places of a client's
    round (`gradleak.fl.places`)."""

    def __init__(self, defenses: list[Defense]):
        self.defenses = list(defenses)

    def __iter__(self):
        return iter(self.defenses)

    def __len__(self) -> int:
        return len(self.defenses)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.defenses]

    @property
    def aggregate_clients(self) -> int:
        return max([d.aggregate_clients for d in self.defenses] or [1])

    def transform_model(self, model: nn.Module) -> nn.Module:
        for d in self.defenses:
            model = d.transform_model(model)
        return model

    def transform_batch(self, x, y, ctx: DefenseContext):
        for i, d in enumerate(self.defenses):
            x, y = d.transform_batch(x, y, _scoped(ctx, i))
        return x, y

    def step_gradient(self, inner: StepGradient, ctx: DefenseContext) -> StepGradient:
        for i, d in enumerate(self.defenses):
            inner = d.wrap_step_gradient(inner, _scoped(ctx, i))
        return inner

    def transform_update(self, update: Update, ctx: DefenseContext) -> Update:
        for i, d in enumerate(self.defenses):
            update = d.transform_update(update, _scoped(ctx, i))
        return update

    @property
    def acts_in_training(self) -> bool:
        """Whether a defense of the chain acts before the final update (on the data, every
        step's gradient or the model): the client then trains under the chain."""
        return any(place != "update" for d in self.defenses for place in d.places)

    def defend(self, update: Update, model: nn.Module, x: torch.Tensor, y: torch.Tensor, training: TrainingSpec,
               generator: torch.Generator, client_state: dict) -> Update:
        """`update`, trained from `model` on (x, y) without defenses, as the client sends it
        under this chain: a chain that acts only on the final update transforms it; one that
        acts during training retrains the client under it (`compute_update`, from a copy of
        `model`). `client_state`: the client's defense memory across rounds (DGC's residuals)."""
        if self.acts_in_training:
            return compute_update(copy.deepcopy(model), x, y, training, self, generator, client_state)
        return self.transform_update(update, DefenseContext(generator, client_state, training, model))


def _scoped(ctx: DefenseContext, index: int) -> DefenseContext:
    """Each defense in a chain gets its own slot of the client's memory."""
    return DefenseContext(ctx.generator, ctx.state.setdefault(index, {}), ctx.training, ctx.model)
