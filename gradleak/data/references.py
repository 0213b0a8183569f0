"""Dataset references, resolved here and nowhere else: a registered name with options
(`mnist`, `cifar10:resize=64`, `news:tokenizer=minilm`) or a bare path to the user's files (a
folder of images, an `.npz`/`.safetensors`/`.pt` file of tensors) becomes a `DatasetSpec`, and
`load_reference` a loaded `Dataset`; `resolve_data` resolves the user's data once for an audit or a
scenario (`ResolvedData`). Code downstream receives the objects, never the names."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import GradleakError
from ..options import parse_spec, path_kind
from .base import Dataset, DatasetSpec

# A bare path in place of a dataset name: a folder of images or a tensor file.
TENSOR_FILE_SUFFIXES = (".npz", ".safetensors", ".pt", ".pth")


def dataset_path_form(text: str) -> str | None:
    """The registered loader for a bare path (`data/client.npz`, `photos/`), or
    None when `text` is a dataset name."""
    head = text.strip()
    if not head or (":" in head and parse_spec(head, "dataset").name in _dataset_names()):
        return None
    if "/" not in head and "\\" not in head and not head.lower().endswith(TENSOR_FILE_SUFFIXES):
        return None
    if head.lower().endswith(TENSOR_FILE_SUFFIXES):
        return "tensors"
    return "image-folder"


def reference_label(text: str) -> str:
    """A dataset reference's name for tables: the registered name, or the path as given."""
    return text.strip() if dataset_path_form(text) is not None else parse_spec(text, "dataset").name


def _dataset_names():
    from . import DATASETS

    return DATASETS.names()


def dataset_spec(text: str, split: str, resize: int | None, seq_len: int | None = None) -> DatasetSpec:
    loader = dataset_path_form(text)
    if seq_len is not None and loader is not None:
        raise GradleakError("--seq-len applies to the text datasets (news, polarity), not to a file of inputs")
    if loader is not None:
        path = Path(text.strip()).expanduser()
        if path_kind(path, "dataset path") is None:
            raise GradleakError(f"dataset path '{path}' not found")
        return DatasetSpec(loader, split=split, resize=resize, path=str(path))
    spec = parse_spec(text, "dataset")
    opts = dict(spec.options)
    known = {"path", "resize", "crop", "channels", "tokenizer"}
    bad = [k for k in opts if k not in known]
    if bad:
        raise GradleakError(f"dataset option '{bad[0]}' unknown; valid: {', '.join(sorted(known))}")

    def as_int(key):
        if key not in opts:
            return None
        try:
            return int(opts[key])
        except ValueError:
            raise GradleakError(f"dataset option '{key}' must be an integer, got '{opts[key]}'") from None

    return DatasetSpec(spec.name, split=split, resize=resize if resize is not None else as_int("resize"),
                       crop=as_int("crop"), path=opts.get("path"), channels=as_int("channels"), seq_len=seq_len,
                       options={"tokenizer": opts["tokenizer"]} if "tokenizer" in opts else {})


def load_reference(text: str, split: str = "test", resize: int | None = None, seq_len: int | None = None
                   ) -> Dataset:
    """The dataset a reference names, loaded."""
    from . import load_dataset

    return load_dataset(dataset_spec(text, split, resize, seq_len))


def run_order(size: int, seed: int) -> torch.Tensor:
    """The order a run with `seed` takes a dataset of `size` examples in: its first examples
    are the attacked ones (targets), the rest the other clients' (run_scenario)."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed))


def other_examples(data: Dataset, exclude: torch.Tensor | None, size: int
                   ) -> tuple[torch.Tensor, torch.Tensor, str | None]:
    """The inputs and labels of up to `size` examples of `data` other than `exclude`, the same
    ones for every seed (a fixed draw), and, when there are fewer than `size`, why."""
    from ..seeding import stream

    keep = torch.ones(len(data), dtype=torch.bool)
    if exclude is not None:
        keep[exclude] = False
    pool = keep.nonzero().flatten()
    order = torch.randperm(len(pool), generator=stream(0, "gallery"))
    chosen = pool[order[:size]].sort().values
    note = None
    if len(chosen) < size:
        note = f"all the dataset has{' besides the attacked examples' if exclude is not None else ''}"
    return data.inputs[chosen], data.labels[chosen], note


def held_out_examples(data: Dataset, targets: torch.Tensor) -> Dataset:
    """The examples of `data` other than `targets`."""
    mask = torch.ones(len(data), dtype=torch.bool)
    mask[targets] = False
    return data.subset(mask.nonzero().flatten())


@dataclass(frozen=True)
class ResolvedData:
    """The user's data after the one resolution: the dataset, its label, and where the examples
    an audit needs besides the attacked ones come from, decided from the reference once so
    that nothing downstream parses the name again."""

    dataset: Dataset
    label: str
    spec: DatasetSpec | None = None  # the parsed reference; None for the user's own objects
    # the other split of a named dataset, to re-identify reconstructions among (None: the
    # examples of the data that were not attacked serve, as for a file or a sample set)
    gallery_split: DatasetSpec | None = None
    examples_source: str = "other examples of your data"

    def gallery_draw(self, targets: torch.Tensor, size: int
                     ) -> tuple[torch.Tensor, str, str | None, torch.Tensor] | None:
        """The examples to re-identify reconstructions among when they come from the user's data
        (inputs, source, note, labels: up to `size` examples other than `targets`), drawn here before
        the run; None when the named dataset's other split serves (`gallery_split`)."""
        if self.gallery_split is not None:
            return None
        inputs, labels, note = other_examples(self.dataset, targets, size)
        return inputs, self.examples_source, note, labels

    def prior(self, targets: torch.Tensor) -> Dataset:
        """Held-out examples for attacks granted the data distribution (`prior_data`)."""
        if self.spec is None or self.dataset.samples_only:
            return held_out_examples(self.dataset, targets)
        from . import load_dataset

        return load_dataset(dataclasses.replace(self.spec, split="train" if self.spec.split == "test" else "test"))


def resolve_data(data: Any, split: str, resize: int | None, seq_len: int | None = None) -> ResolvedData:
    """The user's data, resolved: a dataset reference, or tensors, a torch Dataset or DataLoader,
    or a gradleak Dataset (`data.tensors.dataset_from_user`)."""
    if isinstance(data, str):
        from . import TAKES_PATH, load_dataset

        spec = dataset_spec(data, split, resize, seq_len)
        dataset = load_dataset(spec)
        # a file's examples: its other split may be itself
        own_examples = dataset.samples_only or spec.name in TAKES_PATH  # a bare path's loader is one of these
        other = dataclasses.replace(spec, split="train" if split == "test" else "test")
        return ResolvedData(dataset, data, spec, None if own_examples else other,
                            f"other examples of {dataset.name}")
    if seq_len is not None:
        raise GradleakError("seq_len applies to the named text datasets (news, polarity); your own token "
                            "sequences keep their length")
    from .tensors import dataset_from_user

    dataset = dataset_from_user(data)
    return ResolvedData(dataset, dataset.name)
