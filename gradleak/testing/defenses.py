"""The defense contract: a defense names the places it acts at, its options are checked (a wrong
name, a value that is not a number, in one line), and on real examples of each numeric modality,
in FedSGD and in FedAvg, the update it lets out has the structure of the update it was given
(names, shapes, dtype, kind, counts), finite values, the same values for the same client stream,
and leaves the client's model as it was; the update is a function of the client's stream, not of
earlier updates."""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import get_type_hints

import torch

from ..defenses import DEFENSES, Defense, make_chain, make_defense
from ..fl import TrainingSpec, compute_update
from ..models.references import build_named_model
from ..options import field_range
from .probes import modality_data, refused, require

PLACES = {"model", "data", "gradient", "update"}
# (model, modality): what every defense is applied to. Token ids are left out: the data
# defenses (MixUp, InstaHide) mix inputs, which token ids are not.
CLIENTS = (("lenet", "image"), ("mlp:hidden=16", "tabular"))
TRAININGS = {"fedsgd": TrainingSpec(), "fedavg": TrainingSpec(lr=0.05, local_steps=2, local_batch_size=2)}


def check_defense(name: str) -> None:
    """Every part of the contract for the registered defense `name`; raises ContractError (an
    AssertionError) naming the part that fails."""
    check_defense_declarations(name)
    check_defense_privacy(name)
    for model_text, modality in CLIENTS:
        for training in TRAININGS:
            check_defense_update(name, model_text, modality, training)
    check_defense_depends_only_on_the_stream(name)


def check_defense_declarations(name: str) -> None:
    cls = DEFENSES.get(name)
    require(isinstance(cls, type) and issubclass(cls, Defense) and cls.name == name,
            f"'{name}' is not a Defense subclass whose name is its registry key")
    require(DEFENSES.summary(name), "no one-line summary for `gradleak list defenses`")
    defense = make_defense(name)
    require(set(defense.places) <= PLACES, f"places {defense.places} beyond {sorted(PLACES)}")
    require(isinstance(defense.aggregate_clients, int) and defense.aggregate_clients >= 1, "aggregate_clients < 1")
    require(set(defense.places) or defense.aggregate_clients > 1, "acts nowhere")
    require("no_such_option" in refused(make_defense, f"{name}:no_such_option=1"),
            "an unknown option is refused without naming it")
    if cls.Options is None:
        return
    require(dataclasses.is_dataclass(cls.Options), "Options is not a dataclass")
    hints = get_type_hints(cls.Options)
    for field in dataclasses.fields(cls.Options):
        if field_range(field, hints[field.name]) is None:  # not a number
            continue
        for bad in ("abc", "nan"):
            message = refused(make_defense, f"{name}:{field.name}={bad}")
            require(field.name in message or bad in message, f"{field.name}={bad}: refused as {message!r}")


def check_defense_privacy(name: str) -> None:
    epsilon = make_defense(name).privacy(sample_rate=0.01, steps=10, delta=1e-5)
    require(epsilon is None or (isinstance(epsilon, float) and math.isfinite(epsilon) and epsilon > 0),
            f"privacy() is {epsilon!r}, not None or a positive epsilon")


def _client_update(name: str | None, model_text: str, modality: str, training: TrainingSpec, seed: int):
    """A fresh client (its model built and transformed by the defense) and its update."""
    data = modality_data(modality)
    chain = make_chain([name] if name else [])
    model = chain.transform_model(build_named_model(model_text, data.input_shape, data.num_classes, seed=0,
                                                    modality=data.modality))
    before = copy.deepcopy(model.state_dict())
    x, y = data.inputs[:4], data.labels[:4]
    update = compute_update(model, x, y, training, chain, torch.Generator().manual_seed(seed))
    return model, before, update


def check_defense_update(name: str, model_text: str, modality: str, training: str) -> None:
    spec = TRAININGS[training]
    model, before, update = _client_update(name, model_text, modality, spec, seed=7)
    _, _, plain = _client_update(None, model_text, modality, spec, seed=7)
    params = dict(model.named_parameters())
    # the defended model's parameters (a model defense adds its own), shaped as the model's
    require(update.tensors.keys() == params.keys(), "the update does not name the model's parameters")
    require(all(update.tensors[k].shape == p.shape and update.tensors[k].dtype == p.dtype for k, p in params.items()),
            "an update tensor differs in shape or dtype from its parameter")
    shared = plain.tensors.keys() & update.tensors.keys()
    require(shared and all(plain.tensors[k].shape == update.tensors[k].shape for k in shared),
            "the update's tensors are not shaped as the undefended update's")
    require((update.kind, update.steps, update.samples, update.batch_size)
            == (plain.kind, plain.steps, plain.samples, plain.batch_size), "the update's kind or counts changed")
    require(torch.isfinite(update.flat()).all(), "non-finite values in the update")
    # the client's model is what it was: the update is computed functionally
    state = model.state_dict()
    require(all(torch.equal(state[k], v) for k, v in before.items()), "the client's model was changed")
    # the same client stream gives the same update
    _, _, again = _client_update(name, model_text, modality, spec, seed=7)
    require(all(torch.equal(again.tensors[k], update.tensors[k]) for k in update.tensors),
            "the same client stream gave another update")


def check_defense_depends_only_on_the_stream(name: str) -> None:
    """compute_update is a function of the model, the batch, the training, the defenses and
    the client's stream: the same model object trained twice on one stream sends one update."""
    data = modality_data("image")
    chain = make_chain([name])
    model = chain.transform_model(build_named_model("lenet", data.input_shape, data.num_classes, seed=0,
                                                    modality=data.modality))
    x, y = data.inputs[:4], data.labels[:4]
    first, second = (compute_update(model, x, y, TrainingSpec(), make_chain([name]), torch.Generator().manual_seed(3))
                     for _ in range(2))
    require(all(torch.equal(first.tensors[k], second.tensors[k]) for k in first.tensors),
            "a second update on the same stream differs from the first")
