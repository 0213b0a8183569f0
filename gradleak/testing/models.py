"""The model contract: for each modality a model builds for its real examples or refuses in one
line, reads at least one modality, and where it builds it is seeded (same seed, same weights;
the caller's random stream untouched), float32 and finite, returns one finite logit row per
example, trains every parameter, and is what the client trains and sends an update of."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data.base import Dataset
from ..errors import GradleakError
from ..fl import TrainingSpec, compute_update
from ..modalities import MODALITIES
from ..models import MODELS
from ..models.references import build_named_model
from .probes import MODALITY_DATA, modality_data, model_text, one_line, require


def check_model(name: str) -> None:
    """Every part of the contract for the registered model `name`; raises ContractError (an
    AssertionError) naming the part that fails."""
    require(MODELS.summary(name), "no one-line summary for `gradleak list models`")
    reads = {modality: data for modality in MODALITIES if (data := data_it_reads(name, modality)) is not None}
    require(reads, f"model '{name}' reads none of {', '.join(MODALITIES)}")
    for data in reads.values():
        check_model_on(name, data)


def _build(name: str, data: Dataset, seed: int = 0):
    return build_named_model(model_text(name), data.input_shape, data.num_classes, seed=seed,
                             modality=data.modality)


def data_it_reads(name: str, modality: str) -> Dataset | None:
    """The first of the modality's contract datasets the model builds for and reads a batch of,
    or None (with every refusal one line)."""
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


def check_model_on(name: str, data: Dataset) -> None:
    state = torch.random.get_rng_state()
    model = _build(name, data, seed=5)
    require(torch.equal(torch.random.get_rng_state(), state), "building drew from the caller's generator")
    again, other = _build(name, data, seed=5), _build(name, data, seed=6)
    params = dict(model.named_parameters())
    require(params and model.training, "no parameters, or built in eval mode")
    require(all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in params.values()),
            "parameters not float32 and finite")
    require(all(torch.equal(p, dict(again.named_parameters())[k]) for k, p in params.items()),
            "same seed, other weights")
    require(any(not torch.equal(p, dict(other.named_parameters())[k]) for k, p in params.items()),
            "the seed changes nothing")

    x, y = data.inputs[:2], data.labels[:2]
    out = model(x)
    # one row of logits per example, or per position where the labels are next tokens
    require(out.shape == (2, *y.shape[1:], data.num_classes),
            f"output of shape {tuple(out.shape)}, not {(2, *y.shape[1:], data.num_classes)}")
    require(out.dtype == torch.float32 and torch.isfinite(out).all(), "output not float32 and finite")
    F.cross_entropy(out.reshape(-1, data.num_classes), y.reshape(-1)).backward()
    untrained = [k for k, p in params.items() if p.grad is None]
    require(not untrained, f"parameters the loss does not reach: {untrained}")

    update = compute_update(again, x, y, TrainingSpec())
    require(update.tensors.keys() == params.keys()
            and all(update.tensors[k].shape == p.shape for k, p in params.items()),
            "the client's update is not shaped as the model's parameters")
    require(torch.isfinite(update.flat()).all(), "non-finite values in the client's update")
