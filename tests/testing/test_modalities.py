"""Every modality (gradleak.modalities), through the same interface checks: real data of it
that its record describes, a scorer that can be imported, headline scores that a copy of the
batch gets and that rank the copy above noise, a copy criterion the copy meets, a clamp into
its range, probe inputs a model of it reads, a re-identification distance, the terminal and
report lines, and at least one attack and one built-in model for it. A new modality is checked
by being registered in MODALITIES (and to gradleak/testing/probes.py MODALITY_DATA, which this
suite asks for)."""
from __future__ import annotations

import importlib

import pytest
import torch

from gradleak.attacks import ATTACKS, make_attack
from gradleak.metrics import score_batch, summarize
from gradleak.metrics.reidentify import reid_distances
from gradleak.modalities import MODALITIES, Modality
from gradleak.models import MODELS
from gradleak.models.references import build_named_model
from gradleak.testing.probes import MODALITY_DATA, modality_data, model_text

NAMES = list(MODALITIES)


def test_every_modality_has_contract_data():
    assert set(MODALITY_DATA) == set(MODALITIES)


@pytest.mark.parametrize("name", NAMES)
def test_its_data_is_what_the_record_says(name):
    kind = MODALITIES.get(name)
    assert kind.name == name and isinstance(kind, Modality)
    for index in range(len(MODALITY_DATA[name])):
        data = modality_data(name, index)
        assert data.modality == name and data.inputs.dtype == kind.input_dtype
        assert torch.equal(kind.clamp(data.inputs), data.inputs), "real data lies outside the modality's range"
        assert (data.tokenizer is not None) == (not kind.input_dtype.is_floating_point)  # ids need a vocabulary
    generator = torch.Generator().manual_seed(0)
    probes = kind.probe_inputs(3, data.input_shape, generator)
    assert probes.shape == (3, *data.input_shape) and torch.isfinite(probes).all()
    assert kind.example(data.input_shape).shape == (1, *data.input_shape)
    assert kind.example(data.input_shape).dtype == kind.input_dtype


@pytest.mark.parametrize("name", NAMES)
def test_scorer_headline_copy_criterion_and_ranking(name):
    kind, data = MODALITIES.get(name), modality_data(name)
    module, _, function = kind.scorer.partition(":")
    assert callable(getattr(importlib.import_module(module), function))
    x, y = data.inputs[:4], data.labels[:4]
    copy_scores, _ = score_batch(x, y, x.clone(), y.clone(), name, lpips="none", tokenizer=data.tokenizer)
    copied = summarize(copy_scores)
    assert kind.copy_criterion and copied["asr"] == 1.0, "an exact copy does not meet the copy criterion"
    assert all(copied.get(score.key) is not None for score in kind.scores), "a headline score is missing"
    assert copied[kind.headline] == copied[kind.scores[0].key]
    generator = torch.Generator().manual_seed(1)
    if not kind.input_dtype.is_floating_point:  # token ids
        noise = torch.randint(1, 1000, x.shape, generator=generator)
    else:
        noise = kind.probe_inputs(4, data.input_shape, generator)
    noise_scores, _ = score_batch(x, y, noise, None, name, lpips="none", tokenizer=data.tokenizer)
    noisy = summarize(noise_scores)
    assert noisy["asr"] == 0.0
    assert kind.rank(copied) < kind.rank(noisy), "the copy does not rank above noise"
    # the terminal line and the report's words name every headline score
    line, words = kind.score_line(copied), kind.score_words(copied, lambda v, d: f"{v:.{d}g}")
    assert line is not None and all(score.title in line and score.title in words for score in kind.scores)


@pytest.mark.parametrize("name", NAMES)
def test_clamp_and_reidentification_distance(name):
    kind, data = MODALITIES.get(name), modality_data(name)
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    clamped = kind.clamp(x)
    assert clamped.shape == x.shape
    if kind.value_range is None:
        assert torch.equal(clamped, x)
    else:
        lo, hi = kind.value_range
        assert clamped.min() >= lo and clamped.max() <= hi
        assert torch.equal(clamped[(x >= lo) & (x <= hi)], x[(x >= lo) & (x <= hi)])
    assert reid_distances(name, data.input_shape, "none")[0] == kind.reid_distance


@pytest.mark.parametrize("name", NAMES)
def test_some_attack_and_some_built_in_model_take_it(name):
    data = modality_data(name)
    kind = MODALITIES.get(name)
    assert any(name in ATTACKS.get(a).modalities for a in ATTACKS.names()), f"no attack handles {name} data"
    for attack in ATTACKS.names():  # the one compatibility check between an attack and the data
        fits = name in ATTACKS.get(attack).modalities
        assert kind.refuses(make_attack(attack)) == (None if fits else f"does not handle {name} data"), attack
    readers = []
    for model in MODELS.names():
        try:
            build_named_model(model_text(model), data.input_shape, data.num_classes, modality=name)
        except Exception:
            continue
        readers.append(model)
    assert readers, f"no built-in model reads {name} data"
