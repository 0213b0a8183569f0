"""Attack interface."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from ..errors import GradleakError
from ..fl.training import TrainingSpec
from ..threat import Observation, ThreatModel

# What the learned inverter (gradleak.attacks.learned.learned) needs to play the client on auxiliary data:
# the batch, the client's training and its defenses.
LEARNED_KNOWLEDGE = frozenset({"batch_size", "local_training", "defenses"})


@dataclass
class Reconstruction:
    """What an attack returns for one observed update.

    `inputs` may hold more or fewer rows than the true batch; scoring matches
    them to the originals (Hungarian assignment).
    """

    inputs: torch.Tensor
    labels: torch.Tensor | None = None
    iterations: int = 0
    # Attack-side success signal (e.g. CPL: gradient distance under a threshold).
    converged: bool | None = None
    final_distance: float | None = None
    # matching distance every few iterations, with the iteration and the seconds since the start
    trace: list[float] = field(default_factory=list)
    trace_iterations: list[int] = field(default_factory=list)
    trace_seconds: list[float] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class PreparedModel:
    """What a malicious server's `prepare_model` returns: the model it sends, and the
    secrets it keeps about that model (e.g. which rows it crafted), which the
    Observation carries back to the same attack's `reconstruct` as
    `obs.server_secrets`. Attacks keep no hidden state between the two calls."""

    model: nn.Module
    secrets: Any = None


@dataclass
class AttackContext:
    seed: int = 0
    device: torch.device = torch.device("cpu")
    # progress(iteration, total, objective) for live bars; None = silent
    progress: Callable[[int, int, float], None] | None = None
    # Held-out data for prepare_model, set only when the threat model grants prior_data.
    prior_data: Any = None
    # A folder for what attacks train once and reuse across a study (the learned inverters);
    # None: nothing is kept.
    artifacts: Path | None = None
    # time.perf_counter() past which an attack stops where it is and returns what it has (a time
    # budget kept inside the attack, not only between attacks); None: no limit
    deadline: float | None = None

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def generator(self, offset: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + offset)


class Attack(ABC):
    """Base class. Subclasses set `name`, `Options`, the knowledge they need
    (`requires`), the knowledge they use when granted (`uses`), and implement
    `reconstruct`. Malicious-server attacks set `malicious = True` and
    implement `prepare_model`, which runs before the client trains and returns
    the model sent plus the server's secrets (`PreparedModel`)."""

    name: ClassVar[str] = ""
    Options: ClassVar[type | None] = None
    requires: ClassVar[frozenset[str]] = frozenset()
    uses: ClassVar[frozenset[str]] = frozenset()
    malicious: ClassVar[bool] = False
    modalities: ClassVar[tuple[str, ...]] = ("image", "tabular")

    def __init__(self, options: Any = None):
        self.options = options if options is not None else (self.Options() if self.Options else None)

    def needs(self) -> frozenset[str]:
        extra = {"malicious_model"} if self.malicious else set()
        init = getattr(self.options, "init", None)
        if init == "optimal":
            extra.add("prior_data")  # the start is a held-out example of each recovered label
        if init == "learned":
            extra |= LEARNED_KNOWLEDGE  # the start is the learned inverter's output, trained as the client trains
        return self.requires | frozenset(extra)

    # Budget presets (see gradleak.api.BUDGETS): option overrides for "quick" and
    # "thorough"; "standard" is the attack's own defaults.
    budgets: ClassVar[dict[str, dict[str, Any]]] = {}
    # Named option sets a user asks for as `name:preset=NAME` (explicit options win).
    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    def unsupported(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                    modality: str) -> str | None:
        """Why this attack cannot run on this architecture (one line), judged on the
        model's modules; None when it can. Knowledge the attack needs is the threat
        model's business (`needs`), not this check's."""
        from ..modalities import MODALITIES

        return MODALITIES.get(modality).refuses(self) if modality in MODALITIES else \
            f"does not handle {modality} data"

    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> PreparedModel:
        """Malicious attacks: the model the server sends instead, with the secrets it
        keeps for `reconstruct` (read there as `obs.server_secrets`)."""
        return PreparedModel(model)

    def client_model(self, prepared: PreparedModel, client: int) -> nn.Module:
        """The model a malicious server sends to client `client` of a secure-aggregation group
        (0: the attacked client). By default every client gets the same model; an attack that
        tells clients apart in the aggregate (loki) sends each its own."""
        return prepared.model

    @abstractmethod
    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        """Reconstruct the client's batch from what the server observed."""

    def blind_to(self, training: TrainingSpec) -> str | None:
        """What of the client's training this attack does not model, in one line (None: it
        models all it needs). A verdict that the data is safe cannot rest on such an attack."""
        return None

    def redundant_for(self, training: TrainingSpec, samples: int) -> str | None:
        """Why running this attack on a client that trains this way on `samples` examples would
        only repeat another one (one line; `attacks="auto"` skips it), or None."""
        return None

    # An iterative attack's result may change with more iterations; an analytic one's cannot,
    # so the auditor calls it saturated by construction.
    iterative: ClassVar[bool] = False

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        """The reconstruction at each rung of a budget ladder: at the configured budget, then
        after each doubling of it, every rung resuming where the last one stopped. The caller
        decides how far to climb. An attack that cannot resume yields its one result."""
        yield self.reconstruct(obs, ctx)

    def budget(self) -> int | None:
        """The iterations (per restart) of the ladder's first rung; None for an attack
        without an iteration budget."""
        iterations = getattr(self.options, "iterations", None)
        return int(iterations) if isinstance(iterations, int) else None

    def saturation_floor(self) -> int:
        """The fewest iterations at which a flat quality curve means saturation: an eighth of
        the attack's default budget. Below it an attack has barely left its start (IG on
        MNIST/LeNet gains 0.2 and 0.4 dB from 25 to 50 to 100 iterations, then 1.2, 8 and
        9.5 dB over the next three doublings)."""
        default = type(self)(None).budget() if self.Options is not None else None
        return max(1, default // 8) if default else 1


class ResumableAttack(Attack):
    """An attack run by the optimisation engine: `rungs` climbs its budget ladder without
    starting over, and `reconstruct` is its first rung."""

    iterative = True

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        return next(iter(self.rungs(obs, ctx)))

    def blind_to(self, training: TrainingSpec) -> str | None:
        """These attacks replay the client's training on candidate data: they cannot replay
        augmentation draws or a batch order the server does not know."""
        if training.augment and not training.is_fedsgd:
            return (f"replays the client's training without its random {'/'.join(training.augment)} "
                    "draws (the fedavg attack models them)")
        if training.augment:
            return f"matches one gradient of {'/'.join(training.augment)}-augmented examples as if unaugmented"
        if training.order == "unknown" and not training.is_fedsgd:
            return "needs the client's batch order, which the server does not know (the fedavg attack does not)"
        return None

    @abstractmethod
    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        """See `Attack.rungs`."""


def check_result(check: Callable[[], Any]) -> str | None:
    """The message of the GradleakError `check()` raises, or None: the same
    architecture checks serve `unsupported` and the attack at run time."""
    from ..errors import GradleakError

    try:
        check()
    except GradleakError as exc:
        return str(exc)
    return None


class AttackRefused(GradleakError):
    """An attack that does not fit this threat model, the data's modality or the architecture
    (`refusal`). `reason` is the one line an audit lists the skipped attack with; the message
    names the attack and, when the threat model withholds knowledge, what to add."""

    def __init__(self, name: str, reason: str, hint: str | None = None):
        super().__init__(f"attack '{name}' {reason}" + (f"; add {hint}" if hint else ""))
        self.reason = reason


def refusal(attack: Attack, threat: ThreatModel, modality: str, model: nn.Module | None = None,
            input_shape: tuple[int, ...] = (), num_classes: int = 0) -> str | None:
    """The one attack/threat compatibility decision, for attack selection and for every run:
    why `attack` cannot run here (one line), or None. The threat model's refusal comes first,
    then the data's modality, then (given the model) the architecture (`Attack.unsupported`)."""
    reason = threat.refuses(attack.needs())
    if reason:
        return reason
    if modality not in attack.modalities:  # before the architecture: an override may not check it
        return f"does not handle {modality} data"
    return attack.unsupported(model, tuple(input_shape), num_classes, modality) if model is not None else None


def check_fits(name: str, attack: Attack, threat: ThreatModel, modality: str, model: nn.Module | None = None,
               input_shape: tuple[int, ...] = (), num_classes: int = 0) -> None:
    """Raise `AttackRefused` with `refusal`'s reason when there is one."""
    reason = refusal(attack, threat, modality, model, input_shape, num_classes)
    if reason:
        raise AttackRefused(name, reason, threat.hint(attack.needs()) if threat.refuses(attack.needs()) else None)
