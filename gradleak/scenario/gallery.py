"""The examples the auditor re-identifies reconstructions among (`Gallery`): a fixed draw of
a dataset's examples that were not attacked, or a named dataset's other split."""
from __future__ import annotations

import functools

import torch

from ..data import Dataset, DatasetSpec, load_dataset
from ..data.references import dataset_path_form, dataset_spec, other_examples
from ..metrics.reidentify import Gallery
from ..options import parse_spec

# Re-identification compares each reconstruction with this many other examples when the
# data has them (Gallery, gradleak.metrics.reidentify).
GALLERY_SIZE = 1000


def gallery_from(data: Dataset, exclude: torch.Tensor | None, source: str, note: str | None = None,
                 size: int = GALLERY_SIZE) -> Gallery:
    """Up to `size` examples of `data` other than `exclude`, the same ones for every seed (a
    fixed draw), described as `source`."""
    inputs, short = other_examples(data, exclude, size)
    return Gallery(inputs, source, short if note is None else note)


def resolved_gallery(split: DatasetSpec | None, draw: tuple[torch.Tensor, str, str | None] | None) -> Gallery:
    """A run's gallery from what the resolve boundary decided: the named dataset's other split
    (`ResolvedData.gallery_split`) or the examples it drew from the user's data
    (`ResolvedData.gallery_draw`)."""
    if split is not None:
        return split_gallery(split)
    if draw is None:
        raise ValueError("a gallery needs the other split or drawn examples")
    return Gallery(*draw)


def gallery_for(dataset: str, split: str, resize: int | None, data: Dataset, targets: torch.Tensor,
                seq_len: int | None = None) -> Gallery:
    """The re-identification gallery of a scenario: GALLERY_SIZE examples of the named
    dataset's other split (the same for every seed, attack and defense of a study), or
    the examples of a sample set or user file that were not attacked."""
    from ..data import TAKES_PATH

    if data.samples_only or dataset_path_form(dataset) is not None or \
            parse_spec(dataset, "dataset").name in TAKES_PATH:  # a file's examples: its other split may be itself
        return gallery_from(data, targets, f"other examples of {data.name}")
    return _split_gallery(dataset, "train" if split == "test" else "test", resize, seq_len)


def _split_gallery(dataset: str, split: str, resize: int | None, seq_len: int | None = None) -> Gallery:
    return split_gallery(dataset_spec(dataset, split, resize, seq_len))


def split_gallery(spec: DatasetSpec) -> Gallery:
    """GALLERY_SIZE examples of the dataset split `spec` names (a resolved reference's
    `gallery_split`), the same for every seed, attack and defense of a study."""
    return _cached_split_gallery(spec, tuple(sorted(spec.options.items())))


@functools.lru_cache(maxsize=4)
def _cached_split_gallery(spec: DatasetSpec, options: tuple) -> Gallery:
    # one per process and study: its perceptual features are computed once, then reused;
    # `options` (the tokenizer) is in the key because DatasetSpec's equality leaves it out
    other = load_dataset(spec)
    return gallery_from(other, None, f"{spec.split}-split examples of {other.name}")


def with_extra(base: Gallery, extra: torch.Tensor | None) -> Gallery:
    """`base` and the gallery examples the user gave (`audit(gallery=...)`)."""
    if extra is None:
        return base
    return Gallery(torch.cat([base.inputs, extra.to(base.inputs.dtype)]), f"{base.source} and of the gallery you gave",
                   None)
