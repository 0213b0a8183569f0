"""What the contract checks run every registered component on: a few real examples of each
modality, the small built-in models that take them, tiny budgets, and one attack run through
the interface the pipeline uses (prepare_model, the client's update, observe, reconstruct)."""
from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..attacks import ATTACKS, Attack, AttackContext, Reconstruction, make_attack
from ..data import DatasetSpec, load_dataset
from ..data.base import Dataset
from ..data.references import held_out_examples
from ..errors import GradleakError
from ..fl import TrainingSpec, compute_update
from ..knowledge import PRESETS
from ..models.references import build_named_model
from ..options import field_range
from ..threat import Observation, ThreatModel, observe

# Real data of each modality, small: every modality in gradleak.modalities needs a row here
# (tests/testing/test_modalities.py fails for one without).
# Each modality's first dataset is the one attacks are run on; models try them in turn (a text
# model reads the token ids of its own tokenizer).
MODALITY_DATA = {
    "image": (DatasetSpec("mnist", split="test", resize=16),),
    "tabular": (DatasetSpec("breast-cancer", split="test"),),
    "text": (DatasetSpec("news", split="test", seq_len=8),
             DatasetSpec("polarity", split="test", seq_len=8, options={"tokenizer": "minilm"})),
}
EXAMPLES = 48  # the first examples of the split: 2 attacked, the rest the server's prior data
BATCH = 2

# Small built-in models per modality, in the order an attack is tried on them: the first one
# its `unsupported` accepts is attacked.
MODEL_CANDIDATES = {
    "image": ("lenet", "mlp:hidden=32", "twolayer:width=32,init=gaussian", "lenet5", "convnet:width=4",
              "lenet5:activation=relu"),
    "tabular": ("mlp:hidden=32", "twolayer:width=32,init=gaussian"),
    "text": ("gpt2:width=32,heads=4",),
}

# Budget options set low wherever an attack has them (clipped into each option's allowed range),
# so that a newly registered attack runs small without an entry here; other option names keep
# their defaults.
TINY_BUDGET: dict[str, Any] = {
    "iterations": 2, "restarts": 1, "inner": 2, "epochs": 1, "samples": 256, "feature_steps": 2,
    "starts": 1, "projections": 8, "refine": 0, "refine_steps": 0, "hidden": 16, "sketch": 64, "batch": 16,
    "width": 64, "refined": 16,
}


@functools.lru_cache(maxsize=None)
def modality_data(modality: str, index: int = 0) -> Dataset:
    data = load_dataset(MODALITY_DATA[modality][index])
    return data.subset(list(range(min(EXAMPLES, len(data)))))


def tiny_options(cls: type[Attack]) -> dict[str, Any]:
    """The attack's budget options at TINY_BUDGET, raised to each option's lower bound."""
    if cls.Options is None:
        return {}
    from typing import get_type_hints

    hints = get_type_hints(cls.Options)
    options = {}
    for f in dataclasses.fields(cls.Options):
        if f.name not in TINY_BUDGET or not isinstance(f.default, (int, float)) or isinstance(f.default, bool):
            continue
        value = min(TINY_BUDGET[f.name], f.default)
        bounds = field_range(f, hints[f.name])
        options[f.name] = max(value, bounds[0]) if bounds else value
    return options


def tiny_attack(name: str) -> Attack:
    return make_attack(f"{name}:" + ",".join(f"{k}={v}" for k, v in tiny_options(ATTACKS.get(name)).items())
                       if tiny_options(ATTACKS.get(name)) else name)


def attack_threat(attack: Attack, without: str | None = None) -> ThreatModel:
    """The least a server needs for `attack`: its preset (malicious or honest) and what it
    declares beyond it; `without` one piece of that."""
    preset = "malicious" if attack.malicious else "honest"
    grants = PRESETS[preset] | attack.needs()
    if without is not None:
        grants = grants - {without}
    return ThreatModel(f"contract-{preset}" + (f"-without-{without}" if without else ""), frozenset(grants))


def accepted_models(attack: Attack, modality: str) -> list[str]:
    """The candidate models of `modality` the attack says it can run on, in order."""
    data = modality_data(modality)
    accepted = []
    for text in MODEL_CANDIDATES[modality]:
        model = build_named_model(text, data.input_shape, data.num_classes, seed=0, modality=modality)
        if attack.unsupported(model, data.input_shape, data.num_classes, modality) is None:
            accepted.append(text)
    return accepted


def fitting_model(attack: Attack, modality: str) -> str | None:
    """The first candidate model of `modality` the attack says it can run on."""
    return next(iter(accepted_models(attack, modality)), None)


@dataclass
class AttackRun:
    observation: Observation
    reconstruction: Reconstruction
    sent_model_before: dict[str, torch.Tensor]
    sent_model_after: dict[str, torch.Tensor]


def observation(attack: Attack, model_text: str, modality: str, threat: ThreatModel, seed: int = 0
                ) -> tuple[Observation, AttackContext]:
    """The server's view of one client's FedSGD update on the first BATCH examples, under `threat`."""
    data = modality_data(modality)
    model = build_named_model(model_text, data.input_shape, data.num_classes, seed=seed, modality=modality)
    targets = torch.arange(BATCH)
    x, y = data.inputs[targets], data.labels[targets]
    prior = held_out_examples(data, targets) if "prior_data" in threat.grants else None
    ctx = AttackContext(seed=seed, prior_data=prior)
    secrets = None
    if attack.malicious:
        prepared = attack.prepare_model(model, data.input_shape, data.num_classes, ctx)
        model, secrets = prepared.model, prepared.secrets
    training = TrainingSpec()
    update = compute_update(model, x, y, training, generator=torch.Generator().manual_seed(seed))
    obs = observe(update, copy.deepcopy(model), threat, input_shape=data.input_shape, num_classes=data.num_classes,
                  training=training, batch_size=BATCH, labels=y, defenses=[], modality=modality,
                  tokenizer=data.tokenizer, prior_data=prior, server_secrets=secrets, inputs=x)
    return obs, ctx


def run_attack(name: str, model_text: str, modality: str, seed: int = 0) -> AttackRun:
    attack = tiny_attack(name)
    obs, ctx = observation(attack, model_text, modality, attack_threat(attack), seed)
    before = {k: v.clone() for k, v in obs.model.state_dict().items()}
    reconstruction = attack.reconstruct(obs, ctx)
    return AttackRun(obs, reconstruction, before, dict(obs.model.state_dict()))


# Smaller variants of the built-in models where the contract is about behaviour, not size (as
# tests/models/test_models.py sizes them); a model without an entry is built as it comes.
MODEL_OPTIONS = {"convnet": "width=8", "vgg16": "width_divisor=8", "twolayer": "width=64", "mlp": "hidden=32;16",
                 "gpt2": "width=32,heads=4", "minilm": "pretrained=false,layers=1"}


def model_text(name: str) -> str:
    return f"{name}:{MODEL_OPTIONS[name]}" if name in MODEL_OPTIONS else name


class ContractError(AssertionError):
    """A component breaks gradleak's contract for its kind; the message says which part."""


def require(condition: Any, message: str) -> None:
    """Raise ContractError(message) unless `condition` (kept under `python -O`, unlike assert)."""
    if not condition:
        raise ContractError(message)


def one_line(exc: BaseException | Any) -> str:
    """The message of a refusal (an exception, or pytest's ExceptionInfo of one), required to be one line."""
    message = str(getattr(exc, "value", exc))
    require(message and "\n" not in message.strip(), f"not one line: {message!r}")
    return message


def refused(call, *args, **kwargs) -> str:
    """The one-line message of the GradleakError that `call(*args, **kwargs)` must raise."""
    try:
        call(*args, **kwargs)
    except GradleakError as exc:
        return one_line(exc)
    raise ContractError(f"{getattr(call, '__qualname__', call)} did not refuse with a GradleakError")
