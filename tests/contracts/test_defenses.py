"""Every registered defense, through the same interface checks: it names the places it acts at,
its options are checked (a wrong name, a value that is not a number, in one line), and on real
examples of each numeric modality, in FedSGD and in FedAvg, the update it lets out has the
structure of the update it was given (names, shapes, dtype, kind, counts), finite values, the
same values for the same client stream, and leaves the client's model as it was. A newly
registered defense is checked by being registered."""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import get_type_hints

import pytest
import torch

from gradleak.defenses import DEFENSES, Defense, make_chain, make_defense
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models.references import build_named_model
from gradleak.options import field_range

from .probes import modality_data, one_line

NAMES = DEFENSES.names()
PLACES = {"model", "data", "gradient", "update"}
# (model, modality): what every defense is applied to. Token ids are left out: the data
# defenses (MixUp, InstaHide) mix inputs, which token ids are not.
CLIENTS = [("lenet", "image"), ("mlp:hidden=16", "tabular")]
TRAININGS = {"fedsgd": TrainingSpec(), "fedavg": TrainingSpec(lr=0.05, local_steps=2, local_batch_size=2)}



@pytest.mark.parametrize("name", NAMES)
def test_declarations_and_option_checks(name):
    cls = DEFENSES.get(name)
    assert issubclass(cls, Defense) and cls.name == name
    assert DEFENSES.summary(name), "no one-line summary for `gradleak list defenses`"
    defense = make_defense(name)
    assert set(defense.places) <= PLACES
    assert isinstance(defense.aggregate_clients, int) and defense.aggregate_clients >= 1
    assert set(defense.places) or defense.aggregate_clients > 1, "acts nowhere"
    with pytest.raises(GradleakError) as refused:
        make_defense(f"{name}:no_such_option=1")
    assert "no_such_option" in one_line(refused)
    if cls.Options is None:
        return
    assert dataclasses.is_dataclass(cls.Options)
    hints = get_type_hints(cls.Options)
    for field in dataclasses.fields(cls.Options):
        if field_range(field, hints[field.name]) is None:  # not a number
            continue
        for bad in ("abc", "nan"):
            with pytest.raises(GradleakError) as refused:
                make_defense(f"{name}:{field.name}={bad}")
            assert field.name in one_line(refused) or bad in str(refused.value)


@pytest.mark.parametrize("name", NAMES)
def test_privacy_is_none_or_a_positive_epsilon(name):
    epsilon = make_defense(name).privacy(sample_rate=0.01, steps=10, delta=1e-5)
    assert epsilon is None or (isinstance(epsilon, float) and math.isfinite(epsilon) and epsilon > 0)


def _client_update(name: str | None, model_text: str, modality: str, training: TrainingSpec, seed: int):
    """A fresh client (its model built and transformed by the defense) and its update."""
    data = modality_data(modality)
    chain = make_chain([name] if name else [])
    model = chain.transform_model(build_named_model(model_text, data.input_shape, data.num_classes, seed=0))
    before = copy.deepcopy(model.state_dict())
    x, y = data.inputs[:4], data.labels[:4]
    update = compute_update(model, x, y, training, chain, torch.Generator().manual_seed(seed))
    return model, before, update


@pytest.mark.parametrize("training", list(TRAININGS))
@pytest.mark.parametrize("model_text, modality", CLIENTS, ids=[m for _, m in CLIENTS])
@pytest.mark.parametrize("name", NAMES)
def test_update_keeps_its_structure_is_finite_and_repeats_for_the_same_stream(name, model_text, modality, training):
    spec = TRAININGS[training]
    model, before, update = _client_update(name, model_text, modality, spec, seed=7)
    _, _, plain = _client_update(None, model_text, modality, spec, seed=7)
    params = dict(model.named_parameters())
    # the defended model's parameters (a model defense adds its own), shaped as the model's
    assert update.tensors.keys() == params.keys()
    assert all(update.tensors[k].shape == p.shape and update.tensors[k].dtype == p.dtype for k, p in params.items())
    shared = plain.tensors.keys() & update.tensors.keys()
    assert shared and all(plain.tensors[k].shape == update.tensors[k].shape for k in shared)
    assert (update.kind, update.steps, update.samples, update.batch_size) == \
        (plain.kind, plain.steps, plain.samples, plain.batch_size)
    assert torch.isfinite(update.flat()).all()
    # the client's model is what it was: the update is computed functionally
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in before.items())
    # the same client stream gives the same update
    _, _, again = _client_update(name, model_text, modality, spec, seed=7)
    assert all(torch.equal(again.tensors[k], update.tensors[k]) for k in update.tensors)


@pytest.mark.parametrize("name", NAMES)
def test_an_update_depends_on_the_client_stream_not_on_earlier_updates(name):
    """compute_update is a function of the model, the batch, the training, the defenses and
    the client's stream: the same model object trained twice on one stream sends one update."""
    data = modality_data("image")
    chain = make_chain([name])
    model = chain.transform_model(build_named_model("lenet", data.input_shape, data.num_classes, seed=0))
    x, y = data.inputs[:4], data.labels[:4]
    first, second = (compute_update(model, x, y, TrainingSpec(), make_chain([name]), torch.Generator().manual_seed(3))
                     for _ in range(2))
    assert all(torch.equal(first.tensors[k], second.tensors[k]) for k in first.tensors)
