"""The user's own data as tensors: in memory (`dataset_from_user`) or in a file
(`--dataset tensors:path=FILE` or a bare `FILE.npz|.safetensors|.pt`).

Images are (N, C, H, W) floats in [0, 1] or uint8 (divided by 255); (N, H, W)
gains a channel axis, and (N, H, W, C) with C of 1 or 3 and H, W > 4 is read as
channels-last. Tabular data is (N, D) and used as given (not standardised).
Labels are integer class indices. A file has no split: both splits read it.
"""
from __future__ import annotations

import math
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import GradleakError, ResourceLimitError
from ..options import MAX_CLASSES, path_kind
from .base import Dataset, DatasetSpec
from .modality import modality_of_tensors
from .text import TOKENIZERS

INPUT_KEYS = ("inputs", "x", "images", "data")
LABEL_KEYS = ("labels", "y", "targets")
# Examples read from a torch Dataset or DataLoader: an attack needs a few batches,
# not a whole training set in memory.
DEFAULT_LIMIT = 10_000


def dataset_from_tensors(inputs: Any, labels: Any, name: str = "user", class_names: list[str] | None = None,
                         num_classes: int | None = None, tokenizer: str | None = None) -> Dataset:
    """Validate and wrap (inputs, labels); one GradleakError line for anything off. Integer
    inputs of shape (N, T) are token sequences: labels one class per sequence, or one next
    token per position (N, T) for a language model (give `num_classes`, the vocabulary, then),
    and `tokenizer` the vocabulary they come from (gradleak.data.text: "gpt2", "minilm")."""
    x = _as_tensor(inputs, "inputs")
    y = _as_tensor(labels, "labels")
    if x.shape[0] == 0:
        raise GradleakError(f"data '{name}' is empty")
    kind = modality_of_tensors(x)
    tokens = kind == "text"
    if y.dim() != 1 and not (tokens and tuple(y.shape) == tuple(x.shape)):
        raise GradleakError(f"data '{name}': labels must be one class index per example"
                            f"{' (or one next token per position, shaped as the inputs)' if tokens else ''}, "
                            f"got shape {tuple(y.shape)}")
    if x.shape[0] != y.shape[0]:
        raise GradleakError(f"data '{name}': {x.shape[0]} inputs but {y.shape[0]} labels")
    x, modality = _tokens(x, name) if tokens else _inputs(x, name, image=kind == "image")
    y = _labels(y, name)
    top = int(y.max()) + 1
    if top > MAX_CLASSES:  # one logit and one name per class: refuse before allocating them
        raise ResourceLimitError(f"data '{name}': label {top - 1} implies {top:.3g} classes; the maximum is "
                                 f"{MAX_CLASSES:,} classes")
    if num_classes is None:
        num_classes = len(class_names) if class_names else top
    if top > num_classes:
        raise GradleakError(f"data '{name}': label {top - 1} is out of range for {num_classes} classes")
    names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
    if len(names) != num_classes:
        raise GradleakError(f"data '{name}': {len(names)} class names for {num_classes} classes")
    if tokenizer is not None and modality != "text":
        raise GradleakError(f"data '{name}': a tokenizer applies to token ids, not to {modality} inputs")
    if tokenizer is not None and tokenizer not in TOKENIZERS:
        raise GradleakError(f"data '{name}': unknown tokenizer '{tokenizer}'; choose from: {', '.join(TOKENIZERS)}")
    return Dataset(name, x, y, names, modality, tokenizer=tokenizer)


def _tokens(x: torch.Tensor, name: str) -> tuple[torch.Tensor, str]:
    if x.shape[1] == 0:
        raise GradleakError(f"data '{name}': token sequences of length 0")
    if int(x.min()) < 0:
        raise GradleakError(f"data '{name}': token ids must be >= 0, got {int(x.min())}")
    return x.long().contiguous(), "text"


def dataset_from_user(data: Any, name: str = "user", num_classes: int | None = None,
                      limit: int = DEFAULT_LIMIT) -> Dataset:
    """A gradleak Dataset from what a user has: a gradleak Dataset, (inputs, labels),
    a dict with inputs/labels keys, a map-style torch Dataset or a DataLoader (the
    first `limit` examples)."""
    from torch.utils.data import DataLoader
    from torch.utils.data import Dataset as TorchDataset

    if isinstance(data, Dataset):
        return data
    if isinstance(data, dict):
        return dataset_from_tensors(_pick(data, INPUT_KEYS, name), _pick(data, LABEL_KEYS, name), name,
                                    num_classes=num_classes)
    if isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], (tuple, list)):
        return dataset_from_tensors(data[0], data[1], name, num_classes=num_classes)
    if isinstance(data, DataLoader):
        xs, ys, count = [], [], 0
        for batch in data:
            x, y = _pair(batch, "a DataLoader batch")
            xs.append(torch.as_tensor(x))
            ys.append(torch.as_tensor(y).reshape(-1))
            count += xs[-1].shape[0]
            if count >= limit:
                break
        if not xs:
            raise GradleakError(f"data '{name}': the DataLoader yielded no batch")
        return dataset_from_tensors(torch.cat(xs)[:limit], torch.cat(ys)[:limit], name, num_classes=num_classes)
    if isinstance(data, TorchDataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        try:
            n = min(len(data), limit)
        except TypeError:
            raise GradleakError(f"data '{name}': a torch Dataset must have a length (map-style)") from None
        items = [_pair(data[i], "a Dataset item") for i in range(n)]
        if not items:
            raise GradleakError(f"data '{name}' is empty")
        xs = torch.stack([torch.as_tensor(x) for x, _ in items])
        ys = torch.as_tensor([int(torch.as_tensor(y)) for _, y in items])
        return dataset_from_tensors(xs, ys, name, num_classes=num_classes)
    raise GradleakError(f"data must be (inputs, labels), a torch Dataset or DataLoader, got {type(data).__name__}")


def load_tensor_file(spec: DatasetSpec) -> Dataset:
    """`tensors:path=FILE`: inputs and labels from .npz, .safetensors or .pt/.pth."""
    if not spec.path:
        raise GradleakError("dataset 'tensors' needs :path=FILE (.npz, .safetensors or .pt)")
    path = Path(spec.path).expanduser()
    if path_kind(path, "dataset file") != "file":
        raise GradleakError(f"dataset file '{path}' not found")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        arrays = _read_npz(path)
    elif suffix == ".safetensors":
        arrays = _read_safetensors(path)
    elif suffix in (".pt", ".pth"):
        arrays = _read_torch(path)
    else:
        raise GradleakError(f"dataset file '{path}': unknown type '{suffix}' (use .npz, .safetensors or .pt)")
    where = f"dataset file '{path}'"
    return dataset_from_tensors(_pick(arrays, INPUT_KEYS, where), _pick(arrays, LABEL_KEYS, where), path.name)


def _read_npz(path: Path) -> dict:
    if not zipfile.is_zipfile(path):
        raise GradleakError(f"dataset file '{path}' is not a valid .npz file (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: archive[k] for k in archive.files}
    except ValueError as exc:  # object arrays need pickle, which is refused
        raise GradleakError(f"dataset file '{path}' was rejected: {_first_line(exc)}") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise GradleakError(f"dataset file '{path}' is not a valid .npz file ({_first_line(exc)})") from None


def _read_safetensors(path: Path) -> dict:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # SafetensorError, OSError: all mean "not a valid file"
        raise GradleakError(f"dataset file '{path}' is not a valid safetensors file ({_first_line(exc)})") from None


def _read_torch(path: Path) -> dict:
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: the one-line error says it all
            warnings.simplefilter("ignore")
            content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # forbidden globals (a pickle payload), truncation, foreign bytes
        raise GradleakError(f"dataset file '{path}' was rejected: not a plain tensor file "
                            f"({_first_line(exc)})") from None
    if isinstance(content, (tuple, list)) and len(content) == 2:
        return {"inputs": content[0], "labels": content[1]}
    if isinstance(content, dict):
        return content
    raise GradleakError(f"dataset file '{path}' must hold a dict with inputs/labels or an (inputs, labels) pair")


def _pick(mapping: dict, keys: tuple[str, ...], where: str):
    for key in keys:
        if key in mapping:
            return mapping[key]
    raise GradleakError(f"{where}: no {' / '.join(keys)} entry (found: {', '.join(map(str, mapping)) or 'none'})")


def _pair(item, where: str):
    if isinstance(item, dict):
        return _pick(item, INPUT_KEYS, where), _pick(item, LABEL_KEYS, where)
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return item[0], item[1]
    raise GradleakError(f"{where} must be an (input, label) pair, got {type(item).__name__}")


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        array = np.asarray(value)
    except Exception as exc:
        raise GradleakError(f"{what} cannot be read as an array ({_first_line(exc)})") from None
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise GradleakError(f"{what} must be numeric, got dtype {array.dtype}")
    return torch.from_numpy(np.ascontiguousarray(array))


def _inputs(x: torch.Tensor, name: str, image: bool) -> tuple[torch.Tensor, str]:
    if x.dtype == torch.bool or x.is_complex():
        raise GradleakError(f"data '{name}': inputs of dtype {x.dtype} are not supported")
    if x.dim() not in (2, 3, 4):
        raise GradleakError(f"data '{name}': inputs must be (N, D) tabular or (N, C, H, W) / (N, H, W) images, "
                            f"got shape {tuple(x.shape)}")
    if x.dim() == 3:
        x = x.unsqueeze(1)
    elif x.dim() == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3) and min(x.shape[1:3]) > 4:
        x = x.permute(0, 3, 1, 2)  # channels-last
    if image and x.dtype == torch.uint8:
        return x.float() / 255.0, "image"
    if not x.dtype.is_floating_point:
        raise GradleakError(f"data '{name}': image inputs must be float in [0, 1] or uint8, got {x.dtype}"
                            if image else f"data '{name}': tabular inputs must be float, got {x.dtype}")
    x = x.float()
    if not torch.isfinite(x).all():
        raise GradleakError(f"data '{name}': inputs contain NaN or infinity")
    if image and (float(x.min()) < 0 or float(x.max()) > 1):
        raise GradleakError(f"data '{name}': image inputs must lie in [0, 1] (got {float(x.min()):.3g} to "
                            f"{float(x.max()):.3g}); scale them, or pass uint8")
    if math.prod(x.shape[1:]) == 0:
        raise GradleakError(f"data '{name}': inputs have an empty dimension {tuple(x.shape)}")
    return x.contiguous(), "image" if image else "tabular"


def _labels(y: torch.Tensor, name: str) -> torch.Tensor:
    if y.dtype.is_floating_point:
        if not torch.isfinite(y).all() or not torch.equal(y, y.round()):
            raise GradleakError(f"data '{name}': labels must be whole class indices")
    elif y.dtype == torch.bool or y.is_complex():
        raise GradleakError(f"data '{name}': labels of dtype {y.dtype} are not class indices")
    y = y.long()
    if int(y.min()) < 0:
        raise GradleakError(f"data '{name}': labels must be >= 0, got {int(y.min())}")
    return y


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__
