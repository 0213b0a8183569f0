"""What a Flower message holds for the audit, read in one place for the client mods (the hook's
FlowerAudit, the guard's FlowerGuard): whether it is a train message and of which round, the
arrays the server sent loaded into the app's model, and the update a client's reply makes
(sent − returned), with its sample count; and the app's model built from its model_fn."""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..errors import GradleakError
from ..fl import TrainingSpec, Update


def build_app_model(model_fn: Callable, run_config: Mapping[str, Any]) -> nn.Module:
    """model_fn(), or model_fn(run_config) when it takes a required argument."""
    try:
        required = [p for p in inspect.signature(model_fn).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # a builtin without a signature
        required = []
    model = model_fn(dict(run_config)) if required else model_fn()
    if not isinstance(model, nn.Module):
        raise GradleakError(f"FlowerAudit: model_fn returned {type(model).__name__}, not an nn.Module")
    return model


def is_train(msg) -> bool:
    """Whether a message asks the client to train (the only ones the audit and the guard act on)."""
    return str(msg.metadata.message_type).split(".")[0] == "train"


def round_of(msg) -> int:
    """The server round a train message belongs to (its config's `server-round`)."""
    for record in msg.content.config_records.values():
        if "server-round" in record:
            return int(record["server-round"])
    raise GradleakError("FlowerAudit: the train message carries no 'server-round' in its config "
                        "(the app's strategy is not one of Flower's message-based strategies)")


def state_dict_of(reply) -> dict[str, torch.Tensor]:
    """The one array record a client's reply returns, as tensors."""
    records = list(reply.content.array_records.values())
    if len(records) != 1:
        raise GradleakError(f"FlowerAudit: a reply from node {reply.metadata.src_node_id} holds "
                            f"{len(records)} array records; the hook audits apps that return one")
    return {k: torch.as_tensor(v) for k, v in records[0].to_torch_state_dict().items()}


def load_sent_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """The sent arrays into `model`: all of its state, or (LoRA) its trainable parameters, the
    frozen rest being model_fn's own."""
    expected = model.state_dict()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    partial = any(not p.requires_grad for p in model.parameters()) and not trainable & set(missing)
    if extra or (missing and not partial):
        lora = " (LoRA clients: declare lora_rank in training_keys)" if extra and any(
            k.endswith(("lora_A", "lora_B")) for k in extra) else ""
        raise GradleakError(f"FlowerAudit: the arrays the server sends do not fit model_fn's model "
                            f"(missing {missing[:3]}, unexpected {extra[:3]}){lora}")
    for k in state:
        if tuple(state[k].shape) != tuple(expected[k].shape):
            raise GradleakError(f"FlowerAudit: array '{k}' has shape {tuple(state[k].shape)}, "
                                f"the model's {tuple(expected[k].shape)}")
    model.load_state_dict(state, strict=not missing)


def received_update(model: nn.Module, sent: dict[str, torch.Tensor], reply, training: TrainingSpec,
                     samples: int) -> Update:
    """sent - returned for every parameter: a FedAvg delta in gradleak's sign convention; the
    returned buffers (batch-norm running statistics, num_batches_tracked) as they came back."""
    returned = state_dict_of(reply)
    # every trainable parameter, and a frozen one only when the reply carries it (a LoRA
    # client returns its adapters alone)
    names = [n for n, p in model.named_parameters() if p.requires_grad or (n in returned and n in sent)]
    buffers = {n: returned[n].detach().clone() for n, _ in model.named_buffers() if n in returned}
    missing = [n for n in names if n not in returned]
    if missing:
        raise GradleakError(f"FlowerAudit: the reply from node {reply.metadata.src_node_id} lacks "
                            f"parameter '{missing[0]}'")
    tensors = {}
    for n in names:
        if tuple(returned[n].shape) != tuple(sent[n].shape):
            raise GradleakError(f"FlowerAudit: parameter '{n}' came back with shape {tuple(returned[n].shape)}, "
                                f"sent {tuple(sent[n].shape)}")
        tensors[n] = (sent[n].float() - returned[n].float()).detach()
    update = Update(tensors=tensors, kind="delta", lr=training.lr, steps=training.num_steps(samples),
                    batch_size=training.step_batch_size(samples), samples=samples,
                    epochs=training.local_epochs, buffers=buffers)
    update.check_finite()
    return update


def sample_count(reply) -> int | None:
    """The reply's `num-examples` metric (what FedAvg weights by), when it has one."""
    for record in reply.content.metric_records.values():
        if "num-examples" in record:
            value = record["num-examples"]
            return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
    return None
