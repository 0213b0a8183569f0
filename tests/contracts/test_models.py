"""Every registered model, through the same interface checks: for each modality it builds for a
modality's real examples or refuses in one line, reads at least one modality, and where it
builds it is seeded (same seed, same weights; the caller's random stream untouched), float32
and finite, returns one finite logit row per example, trains every parameter, and is what the
client trains and sends an update of. A newly registered model is checked by being registered."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gradleak.data.modality import MODALITIES
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models import MODELS
from gradleak.models.references import build_named_model

from .probes import MODALITY_DATA, modality_data, model_text, one_line

NAMES = MODELS.names()


def _build(name: str, data, seed: int = 0):
    return build_named_model(model_text(name), data.input_shape, data.num_classes, seed=seed,
                             modality=data.modality)



def _data_it_reads(name: str, modality: str):
    """The first of the modality's datasets the model builds for and reads a batch of, or None
    (with every refusal one line)."""
    for index in range(len(MODALITY_DATA[modality])):
        data = modality_data(modality, index)
        try:
            with torch.no_grad():
                _build(name, data)(data.inputs[:2])
        except GradleakError as exc:
            one_line(exc)
            continue
        return data
    return None


@pytest.mark.parametrize("name", NAMES)
def test_reads_a_modality_seeded_finite_and_trainable_and_refuses_the_others_inone_line(name):
    assert MODELS.summary(name), "no one-line summary for `gradleak list models`"
    reads = {modality: data for modality in MODALITIES if (data := _data_it_reads(name, modality)) is not None}
    assert reads, f"model '{name}' reads none of {', '.join(MODALITIES)}"
    for data in reads.values():
        _check_model_on(name, data)


def _check_model_on(name: str, data) -> None:
    state = torch.random.get_rng_state()
    model = _build(name, data, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state), "building drew from the caller's generator"
    again, other = _build(name, data, seed=5), _build(name, data, seed=6)
    params = dict(model.named_parameters())
    assert params and model.training
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in params.values())
    assert all(torch.equal(p, dict(again.named_parameters())[k]) for k, p in params.items()), "same seed, other weights"
    assert any(not torch.equal(p, dict(other.named_parameters())[k]) for k, p in params.items()), \
        "the seed changes nothing"

    x, y = data.inputs[:2], data.labels[:2]
    out = model(x)
    # one row of logits per example, or per position where the labels are next tokens
    assert out.shape == (2, *y.shape[1:], data.num_classes)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    F.cross_entropy(out.reshape(-1, data.num_classes), y.reshape(-1)).backward()
    untrained = [k for k, p in params.items() if p.grad is None]
    assert not untrained, f"parameters the loss does not reach: {untrained}"

    update = compute_update(again, x, y, TrainingSpec())
    assert update.tensors.keys() == params.keys()
    assert all(update.tensors[k].shape == p.shape for k, p in params.items())
    assert torch.isfinite(update.flat()).all()
