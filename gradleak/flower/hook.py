"""`FlowerAudit`: gradleak's hook for an otherwise unmodified Flower app.

Two Flower extension points, one object:

- `audit.client_mod`, a client mod: on the audited rounds it writes the examples
  the client trains on to a folder of the simulation's (for scoring only; they
  never enter a Flower message, so the server never sees them);
- `audit.wrap(strategy, run_config)`, a strategy wrapper: it remembers the global
  arrays each round sends and, in `aggregate_train`, takes every audited reply
  exactly as the server received it (after all of the client's mods, Flower's
  clipping and local DP included), turns `sent - returned` into a gradleak
  `Update` (with the buffers the reply carries) and runs the attacks on it. What
  the threat model may know about the clients' training (optimizer, learning rate,
  local epochs, batch size, shuffling seed) is read from the app's run config, where
  the server legitimately has it; the declared training, replayed on the ground
  truth, must reproduce each captured update (`gradleak.fl.training_check`),
  else the audit warns and no verdict of `holds` follows.

Under `gradleak flower` the hook only captures while the federation runs; the attacks run
after it, in the command's own process (gradleak.flower.attacking): one results-store row
per round × client × attack, written as each finishes, skipped when a rerun finds it stored.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
from torch import nn

from ..errors import GradleakError
from ..fl import TrainingSpec, Update
from ..fl.training import AdamOptions, SGDOptions, training_field_names, training_field_types
from .messages import build_app_model, is_train, load_sent_state, received_update, round_of, sample_count
from .truth import read_truth as _read_truth
from .truth import write_truth as _write_truth

if TYPE_CHECKING:
    from ..fl.training_check import TrainingCheck
    from .strategy import AuditStrategy

# Where the runner (`gradleak flower`) tells the hook to write; see runner.py.
OUT_ENV = "GRADLEAK_FLOWER_OUT"
DEFAULT_OUT = "gradleak-flower"
# TrainingSpec fields the server may learn from the run config: fl.training's one list, but for
# what the reply itself shows (sends_buffers) and what only a simulated client declares (batch
# norm in eval mode; LoRA's B drawn part-way through a fine-tuning).
TRAINING_FIELDS = tuple(name for name in training_field_names()
                        if name not in ("batchnorm", "sends_buffers", "lora_b_std"))
# The optimizer's options (torch.optim's names), which a run config holds as keys of their own:
# added to `optimizer` ("sgd" when not given) as its `name:k=v,...` text.
OPTIMIZER_OPTION_FIELDS = tuple(dict.fromkeys(f.name for options in (SGDOptions, AdamOptions)
                                              for f in dataclasses.fields(options)))


@dataclass
class CapturedUpdate:
    """One audited client update as the server received it, with its ground truth."""

    round: int
    node_id: int
    partition_id: int | None
    sent: dict[str, torch.Tensor]  # the global weights the server sent (state dict)
    update: Update  # sent - returned, for the model's parameters; the returned buffers
    inputs: torch.Tensor
    labels: torch.Tensor
    training: TrainingSpec  # this client's declared training in this round (its shuffling seed)
    training_check: "TrainingCheck | None" = None  # whether that training reproduces `update`
    model: nn.Module | None = None  # model_fn's model with the sent weights (not to be modified)


@dataclass
class FlowerAudit:
    """Audit a Flower app's client updates with gradleak's attacks.

    model_fn:      builds the app's model (architecture only; weights come from the server);
                   called with the run config when it takes a required argument.
    ground_truth:  `(context, message) -> (inputs, labels)`: the examples this client
                   trains on in this round, in the order its data loader indexes them (the
                   app's own data code; the shuffling is declared separately).
    training_keys: gradleak training field → the app's run-config key (`lr`,
                   `local_epochs`, `local_steps`, `local_batch_size`, `optimizer` as
                   `name[:k=v,...]`, e.g. "sgd:momentum=0.9", its options as keys of their
                   own: `momentum`, `dampening`, `nesterov`, `weight_decay`, `beta1`, `beta2`,
                   `eps`; `shuffle_seed`: one seed of every client's shuffling DataLoader
                   generator; `shuffle` ("unknown": a shuffle the server cannot replay),
                   `augment` ("crop,flip"), `crop_padding`, `label_smoothing`, `clip_norm`:
                   docs/client-training.md; `lora_rank` (0: no LoRA), `lora_alpha`: the
                   clients fine-tune LoRA adapters (`gradleak.models.lora.apply_lora` on
                   model_fn's model) and the server sends and receives only those); the
                   server knows these.
    shuffle_seed_rule: `(run_config, server_round, client) -> seed`: the seed of a client's
                   shuffling DataLoader generator in a round, as the app derives it (`client`
                   is the node's partition-id, its node id without one). The server is taken
                   to know the rule and the client: the "known order" case.
    rounds:        server rounds to audit; clients: how many clients per audited round
                   (by node id), None for all.
    gallery:       `() -> inputs` or `() -> (inputs, labels)`: examples of the clients' data
                   distribution that the audited clients do not train on (e.g. a held-out
                   split); the auditor re-identifies reconstructions among them, and with
                   labels links each among its own class's (docs/judging.md). Without one,
                   only exact copies can show a leak.
    num_classes:   the model's classes (a language model's vocabulary), when the labels do
                   not show them all; tokenizer: the vocabulary of token ids ("gpt2", "minilm").
    threat:        a threat model, or several (("honest", "malicious")): each attack runs under
                   the weakest of them that grants what it needs. A malicious server's attack
                   crafts the model, and the client's declared training (confirmed on the
                   captured update) is replayed on it with the client's examples.
    attacks, knows, budget, seed, lpips: as for `gradleak.audit`.
    defer_attacks: capture during the federation and attack afterwards (`attack_captured`),
                   as `gradleak flower` does; False attacks each round in `aggregate_train`.
    out:           folder of the results store and the ground-truth exchange; defaults
                   to $GRADLEAK_FLOWER_OUT, else ./gradleak-flower.
    """

    model_fn: Callable[[], nn.Module]
    ground_truth: Callable[[Any, Any], tuple[torch.Tensor, torch.Tensor]]
    training_keys: dict[str, str] = field(default_factory=lambda: {"lr": "lr"})
    shuffle_seed_rule: Callable[[Mapping[str, Any], int, int], int] | None = None
    rounds: tuple[int, ...] = (1,)
    clients: int | None = 2
    gallery: Callable[[], torch.Tensor | tuple[torch.Tensor, torch.Tensor]] | None = None
    num_classes: int | None = None
    tokenizer: str | None = None
    attacks: Any = "auto"
    threat: str | tuple[str, ...] = "honest"
    knows: tuple[str, ...] = ()
    budget: str = "quick"
    seed: int = 0
    lpips: str = "alex"
    out: str | None = None
    defer_attacks: bool = False
    # what "holds" must meet (gradleak.leakage.Tolerance, a mapping or "linkage=0.6,recognizable=0.1")
    tolerance: Any = None
    # Filled on the server side while the federation runs (not sent to clients).
    captured: list[CapturedUpdate] = field(default_factory=list, repr=False)
    _gallery: tuple[torch.Tensor, torch.Tensor | None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        unknown = [k for k in self.training_keys if k not in TRAINING_FIELDS + OPTIMIZER_OPTION_FIELDS]
        if unknown:
            raise GradleakError(f"FlowerAudit: training_keys names '{unknown[0]}'; valid: "
                                f"{', '.join(TRAINING_FIELDS + OPTIMIZER_OPTION_FIELDS)}")
        if self.shuffle_seed_rule is not None and "shuffle_seed" in self.training_keys:
            raise GradleakError("FlowerAudit: give the clients' shuffling seed either as training_keys "
                                "'shuffle_seed' (one seed) or as shuffle_seed_rule (per client and round), not both")
        if "lr" not in self.training_keys:
            raise GradleakError("FlowerAudit: training_keys must name the run-config key of the learning rate "
                                "('lr')")
        self.rounds = tuple(int(r) for r in self.rounds)
        from ..leakage import parse_tolerance

        self.tolerance = parse_tolerance(self.tolerance)
        if not self.threats:
            raise GradleakError("FlowerAudit: threat names no threat model")

    @property
    def threats(self) -> tuple[str, ...]:
        return (self.threat,) if isinstance(self.threat, str) else tuple(self.threat)

    # ---------------------------------------------------------------- paths

    @property
    def out_dir(self) -> Path:
        return Path(self.out or os.environ.get(OUT_ENV) or DEFAULT_OUT).resolve()

    @property
    def store_path(self) -> Path:
        return self.out_dir / "results.db"

    def truth_path(self, server_round: int, node_id: int) -> Path:
        return self.out_dir / "ground-truth" / f"round-{server_round}" / f"node-{node_id}.safetensors"

    # ---------------------------------------------------------------- client side

    def client_mod(self, msg, context, call_next):
        """Flower client mod: record the audited clients' training examples, then train."""
        if is_train(msg):
            server_round = round_of(msg)
            if server_round in self.rounds:
                inputs, labels = self.ground_truth(context, msg)
                partition = context.node_config.get("partition-id")
                _write_truth(self.truth_path(server_round, context.node_id), inputs, labels, partition)
        return call_next(msg, context)

    # ---------------------------------------------------------------- server side

    def wrap(self, strategy, run_config) -> "AuditStrategy":
        """Wrap the app's strategy; `run_config` is the ServerApp's `context.run_config`."""
        from .strategy import AuditStrategy

        return AuditStrategy(strategy, self, self.training_from(run_config), dict(run_config))

    def training_from(self, run_config) -> TrainingSpec:
        """The clients' training as the run config declares it (without a per-client seed)."""
        values: dict[str, Any] = {}
        options: list[str] = []
        for name, key in self.training_keys.items():
            if key not in run_config:
                raise GradleakError(f"FlowerAudit: the run config has no '{key}' (for {name}); "
                                    f"keys: {', '.join(sorted(run_config))}")
            value = run_config[key]
            if name in OPTIMIZER_OPTION_FIELDS:
                options.append(f"{name}={value}")
            else:
                values[name] = _config_value(name, value)
        if values.get("lora_rank") == 0:  # an app's switch for full fine-tuning
            values.pop("lora_rank")
            values.pop("lora_alpha", None)
        if options:
            base = values.get("optimizer", "sgd")
            values["optimizer"] = base + ("," if ":" in base else ":") + ",".join(options)
        return TrainingSpec(**values)

    def client_training(self, training: TrainingSpec, run_config: Mapping[str, Any], server_round: int,
                        client: int) -> TrainingSpec:
        """`training` with this client's shuffling seed in this round, by `shuffle_seed_rule`."""
        if self.shuffle_seed_rule is None:
            return training
        seed = self.shuffle_seed_rule(run_config, server_round, client)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise GradleakError(f"FlowerAudit: shuffle_seed_rule returned {seed!r} for round {server_round}, "
                                f"client {client}; expected a seed >= 0")
        return dataclasses.replace(training, shuffle_seed=seed)

    def audit_round(self, server_round: int, sent: dict[str, torch.Tensor], replies: list,
                    training: TrainingSpec, run_config: Mapping[str, Any]) -> None:
        """Capture the audited replies of one round (`captured`), check the declared training
        on each, and attack them unless `defer_attacks`."""
        from ..fl.training_check import TrainingMismatchWarning, check_declared_training

        model = build_app_model(self.model_fn, run_config)
        # LoRA clients: the adapters on model_fn's base model (its weights stay; the sent arrays
        # are the adapters, whose draw here is overwritten)
        model = training.prepare_model(model, self.seed)
        load_sent_state(model, sent)
        # Audit the same clients in every run: by partition id (node ids are drawn anew per run).
        candidates = []
        for reply in replies:
            if reply.has_error():
                continue
            node = int(reply.metadata.src_node_id)
            inputs, labels, partition = _read_truth(self.truth_path(server_round, node))
            order = partition if partition is not None else node
            candidates.append((order, node, reply, inputs, labels, partition))
        candidates.sort(key=lambda item: (item[0], item[1]))
        if self.clients is not None:
            candidates = candidates[:self.clients]
        round_captured: list[CapturedUpdate] = []
        for _, node, reply, inputs, labels, partition in candidates:
            samples = sample_count(reply)
            if samples is not None and samples != len(inputs):
                raise GradleakError(f"FlowerAudit: node {node} reports num-examples={samples} but trained on "
                                    f"{len(inputs)} examples (check ground_truth)")
            client = partition if partition is not None else node
            client_training = self.client_training(training, run_config, server_round, client)
            update = received_update(model, sent, reply, client_training, samples or len(inputs))
            # a reply carrying the model's buffers (a whole state dict) sends them to the server
            client_training = dataclasses.replace(client_training, sends_buffers=bool(update.buffers))
            captured = CapturedUpdate(server_round, node, partition, sent, update, inputs, labels, client_training,
                                      model=model)
            captured.training_check = check_declared_training(model, update, inputs, labels, client_training)
            if captured.training_check.confirmed is False:
                warnings.warn(f"declared training not confirmed (round {server_round}, client {client}): "
                              f"{captured.training_check.note}", TrainingMismatchWarning, stacklevel=2)
            self.captured.append(captured)
            round_captured.append(captured)
        if not self.defer_attacks:
            self.attack_captured(round_captured, run_config, show_progress=False)

    def attack_captured(self, captured: list[CapturedUpdate] | None = None,
                        run_config: Mapping[str, Any] | None = None, show_progress: bool = True) -> dict:
        """Attack the captured updates (default: all of this run's), storing each attack's
        result as it finishes and skipping those the store already holds; see
        gradleak.flower.attacking."""
        from .attacking import attack_captured

        return attack_captured(self, list(self.captured if captured is None else captured),
                               dict(run_config or {}), show_progress)

    def gallery_examples(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The gallery's examples and their labels (None when it gave inputs alone), read once per run."""
        if self.gallery is None:
            return None
        if self._gallery is None:
            inputs, labels = self.gallery(), None
            if isinstance(inputs, (tuple, list)):
                inputs, labels = (inputs[0], inputs[1]) if len(inputs) > 1 else (inputs[0], None)
            if not isinstance(inputs, torch.Tensor) or inputs.dim() < 2 or len(inputs) == 0:
                raise GradleakError("FlowerAudit: gallery must return a tensor of examples (N, ...), got "
                                    f"{type(inputs).__name__}")
            if labels is not None and (not isinstance(labels, torch.Tensor) or labels.shape != (len(inputs),)):
                raise GradleakError("FlowerAudit: gallery's labels must be a tensor of one class per example "
                                    f"({len(inputs)},), got {getattr(labels, 'shape', type(labels).__name__)}")
            self._gallery = inputs, labels
        return self._gallery


def _config_value(name: str, value: Any) -> Any:
    """A run-config value as the TrainingSpec field `name` takes it; one line if it is not one."""
    kind = training_field_types()[name]  # as the field's annotation says; `augment` is "crop,flip"
    try:
        if kind is tuple:
            return tuple(a.strip() for a in str(value).split(",") if a.strip())
        if kind is str:
            return str(value)
        return float(value) if kind is float else int(value)
    except (TypeError, ValueError):
        raise GradleakError(f"FlowerAudit: the run config's value for {name} is {value!r}, not a "
                            f"{'number' if kind is float else 'whole number'}") from None
