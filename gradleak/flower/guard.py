"""`FlowerGuard`: gradleak's client-side guard as a Flower client mod.

Put `guard.client_mod` first in the ClientApp's mods (outermost), so that it sees the model
the server sent before anything trains on it, and the reply exactly as it would leave the
client (after every other mod, Flower's LocalDpMod included). On every train message of a
run whose run config sets `guard = true`:

- inbound: the received arrays are checked for a crafted model (`gradleak.guard.inbound`)
  against the last model that passed; on a finding the client refuses the round (or, with
  `on_crafted = "safe_copy"`, trains the last model that passed instead);
- outbound: the update (sent - returned) is audited against the client's own examples
  and a gallery of its other examples; while it leaks, the next rung of the defense ladder
  is applied and re-checked; if the top rung leaks, the update is withheld.

A refused or withheld round answers with a Flower error reply (the reason in it; stock
strategies such as FedAvg count it as a failure and aggregate the others) or, with
`withhold_reply = "metrics"`, a reply with no arrays and the metric `guard-withheld`. Sent
replies carry the metrics `guard-rung` and `guard-seconds`. The guard's memory (the last
clean model, the client's own last update, the rung chosen) lives in the node's
`context.state`, which Flower keeps across rounds. Decisions go to the JSON-lines log
(`log` of the config, else $GRADLEAK_GUARD_LOG, else guard.jsonl in the folder of a
`gradleak flower` run, $GRADLEAK_FLOWER_OUT, else ./gradleak-guard.jsonl).

Run-config keys read (all optional but `guard`): `guard` (true/false), `guard-tolerance`,
`guard-ladder` (rungs separated by `;`), `guard-every`, `guard-growth`, `guard-drift`, `guard-start`,
`guard-time-budget`, `guard-on-crafted`, `guard-attacks` (attack specs separated by `;`).
`FlowerGuard.check(run_config)` checks them when the run starts (`gradleak flower` calls it before the simulation, the
example ServerApps first in their `main`), so that a bad value is one line before round 1.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..api.inputs import GivenGallery
from ..errors import GradleakError
from ..fl import TrainingSpec
from ..guard import Guard, GuardConfig
from ..guard.inbound import state_of
from .hook import OUT_ENV, FlowerAudit
from .messages import build_app_model, is_train, received_update, round_of, sample_count

LOG_ENV = "GRADLEAK_GUARD_LOG"
DEFAULT_LOG = "gradleak-guard.jsonl"
STATE_KEY = "gradleak-guard"
# run-config key → GuardConfig field and how its text is read
RUN_CONFIG_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "guard-tolerance": ("tolerance", str),
    "guard-ladder": ("ladder", str),
    "guard-every": ("every", int),
    "guard-growth": ("growth", float),
    "guard-drift": ("drift", float),
    "guard-start": ("start", str),
    "guard-time-budget": ("time_budget", float),
    "guard-on-crafted": ("on_crafted", str),
    "guard-attacks": ("attacks", lambda v: [a.strip() for a in str(v).split(";") if a.strip()]),
}


@dataclass
class FlowerGuard:
    """The guard of a Flower app's clients.

    model_fn:  builds the app's model (architecture only; weights come from the server).
    examples:  `(context, message) -> (inputs, labels)`: the examples this client trains on in
               this round (the app's own data code).
    training:  `(context, server_round) -> TrainingSpec`: how this client trains in this round
               (what the audit's attacks may assume the server knows, and how a rung that acts
               during training retrains it).
    gallery:   `(context) -> inputs` or `(inputs, labels)`: other examples of this client's, not trained on this round,
               among which reconstructions are re-identified; without one only exact copies count.
    config:    the `GuardConfig`; run-config keys `guard-*` override its fields.
    switch:    the run-config key that turns the guard on (absent or false: the mod passes through).
    """

    model_fn: Callable[[], nn.Module]
    examples: Callable[[Any, Any], tuple[torch.Tensor, torch.Tensor]]
    training: Callable[[Any, int], TrainingSpec]
    gallery: Callable[[Any], GivenGallery] | None = None
    config: GuardConfig = field(default_factory=GuardConfig)
    switch: str = "guard"
    num_classes: int | None = None
    tokenizer: str | None = None

    @classmethod
    def from_audit(cls, audit: FlowerAudit, gallery: Callable[[Any], GivenGallery] | None = None,
                   config: GuardConfig | None = None, **kwargs) -> "FlowerGuard":
        """A guard for an app already wired to `FlowerAudit`: its model, examples, declared
        training (run-config keys, per-client shuffling seed) and vocabulary."""
        def training(context, server_round: int) -> TrainingSpec:
            declared = audit.training_from(context.run_config)
            client = context.node_config.get("partition-id", context.node_id)
            return audit.client_training(declared, context.run_config, server_round, int(client))

        return cls(model_fn=audit.model_fn, examples=audit.ground_truth, training=training, gallery=gallery,
                   config=config or GuardConfig(), num_classes=audit.num_classes, tokenizer=audit.tokenizer,
                   **kwargs)

    # ---------------------------------------------------------------- the mod

    def client_mod(self, msg, context, call_next):
        """Flower client mod: the inbound check, training, the outbound audit and ladder."""
        if not is_train(msg):
            return call_next(msg, context)
        try:  # a bad switch or guard-* key: one line to the server, before anything trains
            config = self.check(context.run_config)
        except GradleakError as exc:
            return _no_update(msg, self.config, str(exc), "guard-misconfigured")
        if config is None:
            return call_next(msg, context)
        try:
            server_round = round_of(msg)
            training = self.training(context, server_round)
        except GradleakError as exc:
            return _no_update(msg, self.config, str(exc), "guard-misconfigured")
        # the received arrays read before the guard is built, so that the mod reads the message
        # in one stay and then hands down
        key, received = _arrays_of(msg)
        try:
            client = context.node_config.get("partition-id", context.node_id)
            guard = Guard(config, training=training, num_classes=self.num_classes, tokenizer=self.tokenizer,
                          client=client, state=kept_state(context.state))
        except GradleakError as exc:
            return _no_update(msg, self.config, str(exc), "guard-misconfigured")
        start = time.perf_counter()
        report = guard.inbound(received, server_round)
        if report.crafted:
            if config.on_crafted == "refuse" or guard.previous is None:
                keep_state(guard.state_dict(), context.state)
                return _no_update(msg, config, f"gradleak guard refused round {server_round}: {report.summary()}",
                                  "guard-refused")
            msg = _with_arrays(msg, key, guard.previous)  # the safe copy: the last model that passed
            received = guard.previous
        reply = call_next(msg, context)
        if reply.has_error():
            keep_state(guard.state_dict(), context.state)
            return reply

        # model_fn() or model_fn(run_config), as the audit hook builds it
        model = training.prepare_model(build_app_model(self.model_fn, context.run_config), config.seed)
        model.load_state_dict(received, strict=len(received) == len(model.state_dict()))
        inputs, labels = self.examples(context, msg)
        update = received_update(model, received, reply, training, sample_count(reply) or len(inputs))
        gallery = self.gallery(context) if self.gallery is not None else None
        decision = guard.outbound(model, update, (inputs, labels), gallery=gallery, server_round=server_round,
                                  training=training)
        keep_state(guard.state_dict(), context.state)
        if not decision.send:
            return _no_update(msg, config, f"gradleak guard withheld round {server_round}: {decision.reason}",
                              "guard-withheld")
        returned = {**_arrays_of(reply)[1]}
        for name, delta in decision.update.tensors.items():
            returned[name] = (received[name].float() - delta).to(returned[name].dtype)
        from flwr.app import ArrayRecord

        reply.content.array_records[_arrays_of(reply)[0]] = ArrayRecord(returned)
        for record in reply.content.metric_records.values():
            record["guard-rung"] = int(decision.rung)
            record["guard-seconds"] = float(time.perf_counter() - start)
            break
        return reply

    # ---------------------------------------------------------------- configuration

    def check(self, run_config: Mapping[str, Any]) -> GuardConfig | None:
        """The run's guard configuration, checked before any round: None when the run config
        turns the guard off, else the `GuardConfig` with its `guard-*` keys; one line
        (`GradleakError`) when the switch or a key is bad. The example apps' ServerApps call it
        when the run starts and `gradleak flower` before it starts the simulation."""
        return self.config_for(run_config) if self.enabled(run_config) else None

    def enabled(self, run_config: Mapping[str, Any]) -> bool:
        value = run_config.get(self.switch, False)
        if isinstance(value, str):
            if value.strip().lower() not in ("true", "false", "1", "0", "yes", "no", ""):
                raise GradleakError(f"FlowerGuard: run config '{self.switch}' must be true or false, got {value!r}")
            return value.strip().lower() in ("true", "1", "yes")
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise GradleakError(f"FlowerGuard: run config '{self.switch}' must be true or false, got {value!r}")
        return bool(value)

    def config_for(self, run_config: Mapping[str, Any]) -> GuardConfig:
        """The guard's config with the run config's `guard-*` keys; one line if one is bad."""
        changes: dict[str, Any] = {}
        for key, (name, read) in RUN_CONFIG_KEYS.items():
            if key in run_config:
                value = run_config[key]
                try:
                    if isinstance(value, bool) or (read in (int, float) and isinstance(value, str)
                                                   and not value.strip()):
                        raise ValueError
                    changes[name] = read(value)
                    if read is int and isinstance(value, float) and value != int(value):
                        raise ValueError
                except (TypeError, ValueError):
                    raise GradleakError(f"FlowerGuard: run config '{key}' = {run_config[key]!r} is not "
                                        f"a valid {name}") from None
        if not changes.get("log", self.config.log):
            out = os.environ.get(OUT_ENV)
            changes["log"] = os.environ.get(LOG_ENV) or (os.path.join(out, "guard.jsonl") if out else DEFAULT_LOG)
        fields = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config) if f.init}
        return GuardConfig(**{**fields, **changes})


def _arrays_of(msg) -> tuple[str, dict[str, torch.Tensor]]:
    records = list(msg.content.array_records.items())
    if len(records) != 1:
        raise GradleakError(f"FlowerGuard: a message holds {len(records)} array records; the guard handles "
                            "apps that exchange one")
    key, record = records[0]
    return key, state_of(record.to_torch_state_dict())


def _with_arrays(msg, key: str, state: dict[str, torch.Tensor]):
    from flwr.app import ArrayRecord

    msg.content.array_records[key] = ArrayRecord({k: v.clone() for k, v in state.items()})
    return msg


def _no_update(msg, config: GuardConfig, reason: str, metric: str):
    from flwr.app import Error, Message, MetricRecord, RecordDict

    if config.withhold_reply == "metrics":
        return Message(RecordDict({"metrics": MetricRecord({metric: 1, "num-examples": 0})}), reply_to=msg)
    return Message(Error(code=6, reason=reason), reply_to=msg)  # 6: Flower's MOD_FAILED_PRECONDITION


def keep_state(guard_state: Mapping[str, Any], state) -> None:
    """The guard's memory (`Guard.state_dict()`) into the node's `context.state`, which Flower
    keeps across rounds: the three models as array records; the rung, whether it withholds,
    whether the last audit was decisive and the last audited update's norm and example count as
    a config record."""
    from flwr.app import ArrayRecord, ConfigRecord

    if guard_state["previous"] is not None:
        state.array_records[f"{STATE_KEY}-previous"] = ArrayRecord(
            {k: v.clone() for k, v in guard_state["previous"].items()})
    if guard_state["own_change"] is not None:
        state.array_records[f"{STATE_KEY}-own-change"] = ArrayRecord(
            {k: v.detach().clone() for k, v in guard_state["own_change"].items()})
    if guard_state.get("audited_model") is not None:
        state.array_records[f"{STATE_KEY}-audited-model"] = ArrayRecord(
            {k: v.clone() for k, v in guard_state["audited_model"].items()})
    record: dict[str, Any] = {"rung": int(guard_state["rung"]), "withholding": bool(guard_state["withholding"]),
                              "decisive": bool(guard_state.get("decisive", False))}
    if guard_state.get("audited_norm") is not None:
        record["audited-norm"] = float(guard_state["audited_norm"])
        record["audited-examples"] = int(guard_state["audited_examples"])
    state.config_records[STATE_KEY] = ConfigRecord(record)


def kept_state(state) -> dict[str, Any]:
    """The guard's memory as `keep_state` left it in `context.state` (a plain state dict for
    `Guard(state=...)`; empty in a node's first round)."""
    kept: dict[str, Any] = {}
    if f"{STATE_KEY}-previous" in state.array_records:
        kept["previous"] = state_of(state.array_records[f"{STATE_KEY}-previous"].to_torch_state_dict())
    if f"{STATE_KEY}-own-change" in state.array_records:
        kept["own_change"] = state_of(state.array_records[f"{STATE_KEY}-own-change"].to_torch_state_dict())
    if f"{STATE_KEY}-audited-model" in state.array_records:
        kept["audited_model"] = state_of(state.array_records[f"{STATE_KEY}-audited-model"].to_torch_state_dict())
    if STATE_KEY in state.config_records:
        record = state.config_records[STATE_KEY]
        kept["rung"] = int(record["rung"])
        kept["withholding"] = bool(record["withholding"]) if "withholding" in record else False
        kept["decisive"] = bool(record["decisive"]) if "decisive" in record else False
        if "audited-norm" in record:
            kept["audited_norm"] = float(record["audited-norm"])
            kept["audited_examples"] = int(record["audited-examples"])
    return kept
