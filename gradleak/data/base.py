"""The dataset record every loader returns, and the spec that selects one."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

import torch


@dataclass(frozen=True)
class DataSignature:
    """What a model, an attack and a scorer need to know about the data, as one value (a
    `Dataset`'s `signature`, an `Observation`'s): one example's shape, the number of classes,
    the modality (gradleak.modalities) and, for token ids, the tokenizer they come from."""

    input_shape: tuple[int, ...]
    num_classes: int
    modality: str
    tokenizer: str | None = None


@dataclass
class Dataset:
    """Inputs, integer labels and class names.

    Images: `inputs` is float32 (N, C, H, W) in [0, 1].
    Tabular: `inputs` is float32 (N, D), standardized (zero mean, unit variance per column).
    Text: `inputs` is int64 (N, seq_len) token ids (see gradleak.data.text).
    """

    name: str
    inputs: torch.Tensor
    labels: torch.Tensor
    class_names: list[str]
    modality: Literal["image", "tabular", "text"] = "image"
    # True for the small shipped sample sets (20 foolbox PNGs): usable as attack
    # targets, too small to train a model on.
    samples_only: bool = False
    # text: the tokenizer whose ids `inputs` holds (gradleak.data.text: "gpt2", "minilm"); None
    # for other data and for token ids of an unknown vocabulary
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.inputs.shape[0] != self.labels.shape[0]:
            raise ValueError("inputs and labels disagree on the number of examples")

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.inputs.shape[1:])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def signature(self) -> DataSignature:
        return DataSignature(self.input_shape, self.num_classes, self.modality, self.tokenizer)

    def subset(self, indices: torch.Tensor | list[int]) -> "Dataset":
        idx = torch.as_tensor(indices, dtype=torch.long)
        return Dataset(self.name, self.inputs[idx], self.labels[idx], self.class_names,
                       self.modality, self.samples_only, self.tokenizer)


@dataclass(frozen=True)
class DatasetSpec:
    """Which dataset, which split, and how to reshape it.

    `crop` centre-crops to a square of that side first, `resize` then resizes
    (bilinear, antialiased) to a square of that side; both only for images.
    `path` points at user files for the file-based datasets.
    """

    name: str
    split: Literal["train", "test"] = "train"
    resize: int | None = None
    crop: int | None = None
    path: str | None = None
    channels: int | None = None  # force 1 (grayscale) or 3 (replicate) channels
    seq_len: int | None = None  # tokens per sequence of a text dataset (None: the dataset's default)
    options: dict = field(default_factory=dict, hash=False, compare=False)


def tensors_digest(*tensors: torch.Tensor) -> str:
    """The SHA-256 of the tensors' bytes, in order (the one digest of examples: audits, the
    Flower audit's resume keys)."""
    h = hashlib.sha256()
    for tensor in tensors:
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def data_digest(data: Dataset) -> str:
    """A short digest of a dataset's inputs and labels (an audit's record of what it audited)."""
    return tensors_digest(data.inputs, data.labels)[:16]
