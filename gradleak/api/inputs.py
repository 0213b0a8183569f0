"""What an audit makes of the user's other inputs: seeds, the gallery, the artifacts folder,
and the digests and labels that identify its setting in the results store."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..data import Dataset
from ..errors import GradleakError
from ..metrics.reidentify import Gallery
from ..models.base import hash_weights
from ..scenario.gallery import gallery_for, gallery_from


def audit_seeds(seed: int | Sequence[int]) -> list[int]:
    values: list = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise GradleakError(f"seed must be an integer >= 0 or a list of them, got {seed!r}")
    return [int(v) for v in dict.fromkeys(values)]


def gallery_inputs(gallery: Any, like: Dataset) -> torch.Tensor:
    """The user's gallery examples as inputs shaped like the audited data's."""
    from ..data.tensors import dataset_from_user

    if isinstance(gallery, torch.Tensor):
        gallery = (gallery, torch.zeros(len(gallery), dtype=torch.long))
    extra = dataset_from_user(gallery)
    if extra.input_shape != like.input_shape:
        raise GradleakError(f"gallery examples have shape {extra.input_shape}, the audited data "
                            f"{like.input_shape}")
    return extra.inputs


def gallery_maker(data: Any, dataset: Dataset, split: str, resize: int | None,
                   extra: torch.Tensor | None, seq_len: int | None = None) -> Callable[[torch.Tensor], Gallery]:
    """The re-identification gallery of an audit, given the attacked examples: a named
    dataset's other split, or the examples of the user's data not attacked; plus `extra`."""
    def make(targets: torch.Tensor) -> Gallery:
        if isinstance(data, str):
            base = gallery_for(data, split, resize, dataset, targets, seq_len)
        else:
            base = gallery_from(dataset, targets, "other examples of your data")
        if extra is None:
            return base
        return Gallery(torch.cat([base.inputs, extra.to(base.inputs.dtype)]),
                       f"{base.source} and of the gallery you gave", None)
    return make



def artifacts_folder(artifacts: str | Path | None, out: str | Path | None) -> Path:
    from ..data.sources import cache_dir

    if artifacts is not None:
        return Path(artifacts)
    return Path(out) / "artifacts" if out is not None else cache_dir() / "artifacts"



def defense_labels(defenses: tuple[str, ...]) -> dict:
    from ..sweep import defense_label, strength_label

    return {"defense": defense_label(defenses), "strength": strength_label(defenses)}


def model_digest(model: nn.Module) -> str:
    h = hashlib.sha256(type(model).__qualname__.encode())
    hash_weights(h, model)
    return h.hexdigest()[:16]


def data_digest(data: Dataset) -> str:
    h = hashlib.sha256()
    h.update(data.inputs.detach().cpu().contiguous().numpy().tobytes())
    h.update(data.labels.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
