"""Model references, resolved here and nowhere else: a registered name with options
(`lenet`, `convnet:width=64`) or the user's own factory (`path/to/file.py:build:k=v`,
`package.module:Net`) becomes a built, seeded `nn.Module`. Code downstream receives the
objects, never the names: `parse_model_reference` parses a reference once, and building
(`build_reference`) and fitting the data's classes (`fit_classes`) take what it parsed."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..data import Dataset, DataSignature
from ..errors import GradleakError
from ..options import parse_spec
from . import build_model
from .base import ModelSpec


@dataclass(frozen=True)
class ModelReference:
    """A model reference after its one parse: the user's own factory (`user`: built from
    `text` by `models.user`) or a registered name with its options."""

    text: str
    user: bool
    name: str = ""
    options: dict = field(default_factory=dict)


def parse_model_reference(text: str) -> ModelReference:
    """`text` parsed once: the user's factory (`path/to/file.py:factory[:k=v,...]`,
    `package.module:factory[:k=v,...]`) or a built-in model (`name[:k=v,...]`)."""
    from .user import is_user_model_ref

    if is_user_model_ref(text):
        return ModelReference(text, True)
    model_spec = parse_spec(text, "model")
    return ModelReference(text, False, model_spec.name, dict(model_spec.options))


def build_named_model(text: str, input_shape, num_classes: int, seed: int = 0,
                      activation: str | None = None, *, modality: str) -> nn.Module:
    """A built-in model (`name[:k=v,...]`) or the user's own
    (`path/to/file.py:factory[:k=v,...]`, `package.module:factory[:k=v,...]`),
    seeded, checked to output at least one logit per class."""
    return build_reference(parse_model_reference(text), DataSignature(tuple(input_shape), num_classes, modality),
                           seed, activation)


def build_reference(reference: ModelReference, signature: DataSignature, seed: int = 0,
                    activation: str | None = None) -> nn.Module:
    """The model a parsed reference names for data of `signature`, built and seeded, checked to
    output at least one logit per class."""
    from .user import build_user_model, check_model_fits

    shape, classes = tuple(signature.input_shape), signature.num_classes
    if reference.user:
        if activation:
            raise GradleakError("--activation applies to built-in models only; set it in your own model")
        model = build_user_model(reference.text, shape, classes, seed)
    else:
        options = dict(reference.options)
        activation = activation or options.pop("activation", None)
        model = build_model(ModelSpec(reference.name, shape, classes, activation=activation, seed=seed,
                                      options=options))
    check_model_fits(model, shape, classes, f"model '{reference.text}'", modality=signature.modality)
    return model


def resolve_model(model: Any, data: Dataset, seed: int, checkpoint: str | None = None
                  ) -> tuple[nn.Module, str, Dataset]:
    """The user's model as (nn.Module, label, data): a module as it is, a reference (parsed
    at the resolve boundary, `parse_model_reference`, or a string parsed here) built and seeded,
    or a zero-argument factory called under `seed`; then `checkpoint`'s weights, and
    `data` with its class list fitted to the model's outputs (`fit_classes`)."""
    built, label = _built(model, data, seed)
    if checkpoint:
        from .checkpoint import load_checkpoint

        load_checkpoint(built, checkpoint)
    return built, label, fit_classes(built, data)


def _built(model: Any, data: Dataset, seed: int) -> tuple[nn.Module, str]:
    if isinstance(model, nn.Module):
        return model, type(model).__name__
    if isinstance(model, str):
        model = parse_model_reference(model)
    if isinstance(model, ModelReference):
        return build_reference(model, data.signature, seed), model.text
    if callable(model):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            try:
                built = model()
            except GradleakError:
                raise
            except Exception as exc:
                raise GradleakError(f"model factory {getattr(model, '__name__', model)!s} raised "
                                    f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}") from None
        if not isinstance(built, nn.Module):
            raise GradleakError(f"model factory returned {type(built).__name__}, not a torch.nn.Module")
        return built.float(), getattr(model, "__name__", type(built).__name__)
    raise GradleakError(f"model must be an nn.Module, a factory or a model name, got {type(model).__name__}")


def fit_classes(model: nn.Module, data: Dataset) -> Dataset:
    """Check the model's output against the data's classes; widen the class list
    when the model has more outputs than the data's labels reach."""
    from .user import check_model_fits

    width = check_model_fits(model, data.input_shape, data.num_classes, "model", modality=data.modality)
    if width > data.num_classes:
        names = list(data.class_names) + [str(i) for i in range(data.num_classes, width)]
        data = dataclasses.replace(data, class_names=names)
    return data
