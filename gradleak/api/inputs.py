"""What an audit makes of the user's other inputs: seeds, the gallery, the artifacts folder,
and the defense labels that identify its setting in the results store (the digests: `data.base`, `models.base`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence, Union

import torch

from ..data import Dataset
from ..errors import GradleakError
from ..options import parse_chain


def audit_seeds(seed: int | Sequence[int]) -> list[int]:
    values: list = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise GradleakError(f"seed must be an integer >= 0 or a list of them, got {seed!r}")
    return [int(v) for v in dict.fromkeys(values)]


# a gallery as a user gives it: its inputs, or (inputs, labels) so that linkage is judged within a class
GivenGallery = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


def gallery_inputs(gallery: Any, like: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The user's gallery examples as inputs shaped like the audited data's, and their labels
    (-1 for a gallery given as inputs alone: linked against every class, linkage.linkage_among)."""
    from ..data.tensors import dataset_from_user

    labelled = not isinstance(gallery, torch.Tensor)
    if not labelled:
        gallery = (gallery, torch.zeros(len(gallery), dtype=torch.long))
    extra = dataset_from_user(gallery)
    if extra.input_shape != like.input_shape:
        raise GradleakError(f"gallery examples have shape {extra.input_shape}, the audited data "
                            f"{like.input_shape}")
    labels = extra.labels.long() if labelled and extra.labels.dim() == 1 else torch.full((len(extra),), -1)
    return extra.inputs, labels


def artifacts_folder(artifacts: str | Path | None, out: str | Path | None) -> Path:
    from ..data.sources import cache_dir

    if artifacts is not None:
        return Path(artifacts)
    return Path(out) / "artifacts" if out is not None else cache_dir() / "artifacts"



def defense_labels(defenses: tuple[str, ...]) -> dict:
    """The defense and strength labels of `audit`'s defense chain (its texts, parsed here)."""
    from ..sweep import chain_labels

    return chain_labels(parse_chain(defenses))
