"""The examples the auditor re-identifies reconstructions among (`Gallery`): a fixed draw of
a dataset's examples that were not attacked, or a named dataset's other split."""
from __future__ import annotations

import functools

import torch

from ...data import Dataset, DatasetSpec, load_dataset
from ...data.references import other_examples
from ...metrics.reidentify import Gallery

# Re-identification compares each reconstruction with this many other examples when the
# data has them (Gallery, gradleak.metrics.reidentify).
GALLERY_SIZE = 1000


def examples_gallery(data: Dataset, exclude: torch.Tensor | None, source: str, note: str | None = None,
                     size: int = GALLERY_SIZE) -> Gallery:
    """Up to `size` examples of `data` other than `exclude`, the same ones for every seed (a
    fixed draw), described as `source`."""
    inputs, labels, short = other_examples(data, exclude, size)
    return Gallery(inputs, source, short if note is None else note, labels)


def resolved_gallery(split: DatasetSpec | None, draw: tuple[torch.Tensor, str, str | None, torch.Tensor] | None
                     ) -> Gallery:
    """A run's gallery from what the resolve boundary decided: the named dataset's other split
    (`ResolvedData.gallery_split`) or the examples it drew from the user's data
    (`ResolvedData.gallery_draw`)."""
    if split is not None:
        return split_gallery(split)
    if draw is None:
        raise ValueError("a gallery needs the other split or drawn examples")
    return Gallery(*draw)


def split_gallery(spec: DatasetSpec) -> Gallery:
    """GALLERY_SIZE examples of the dataset split `spec` names (a resolved reference's
    `gallery_split`), the same for every seed, attack and defense of a study."""
    return _cached_split_gallery(spec, tuple(sorted(spec.options.items())))


@functools.lru_cache(maxsize=4)
def _cached_split_gallery(spec: DatasetSpec, options: tuple) -> Gallery:
    # one per process and study: its perceptual features are computed once, then reused;
    # `options` (the tokenizer) is in the key because DatasetSpec's equality leaves it out
    other = load_dataset(spec)
    return examples_gallery(other, None, f"{spec.split}-split examples of {other.name}")


def with_extra(base: Gallery, extra: tuple[torch.Tensor, torch.Tensor] | None) -> Gallery:
    """`base` and the gallery examples the user gave (`audit(gallery=...)`: inputs and labels,
    -1 where not known)."""
    if extra is None:
        return base
    inputs, labels = extra
    known = base.labels if base.labels is not None else torch.full((len(base),), -1, dtype=torch.long)
    return Gallery(torch.cat([base.inputs, inputs.to(base.inputs.dtype)]), f"{base.source} and of the gallery you gave",
                   None, torch.cat([known.long(), labels.long()]))
