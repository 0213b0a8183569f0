"""Datasets the user brings as files: CIFAR python batches, MNIST-style IDX, image folders.

Every format is validated while it is read, so a truncated or foreign file
stops with one line naming it instead of a numpy traceback deep inside a run.
"""
from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import GradleakError, InputFileError, ResourceLimitError
from ..options import path_kind
from .base import Dataset, DatasetSpec
from .sources import check_split, safe_unpickle

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
_GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


def user_folder(spec: DatasetSpec) -> Path:
    """`spec.path` as an existing folder, or a GradleakError saying how to pass one."""
    if not spec.path:
        raise GradleakError(f"dataset '{spec.name}' needs :path=DIR")
    root = Path(spec.path).expanduser()
    if path_kind(root, f"dataset '{spec.name}' path") != "dir":
        raise GradleakError(f"dataset '{spec.name}': path {root} is not a folder")
    return root


def _read_bytes(path: Path) -> bytes:
    """Whole file, transparently gunzipped when it ends in .gz."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise GradleakError(f"cannot read {path}: {exc}") from None


# --------------------------------------------------------------------------- IDX

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """Parse one IDX file (the MNIST format): magic, big-endian dims, raw data."""
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise GradleakError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise GradleakError(f"{path}: corrupted IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = math.prod(dims) * dtype.itemsize  # Python integers: a forged header cannot overflow
    if len(raw) - header != expected:
        raise GradleakError(
            f"{path}: corrupted IDX file: header says {dims} ({expected} bytes of data) "
            f"but {len(raw) - header} bytes follow"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def _find_idx(folder: Path, stem: str, kind: str, rank: int) -> Path:
    """train-images-idx3-ubyte[.gz] and the dotted variant train-images.idx3-ubyte."""
    for sep in ("-", "."):
        for suffix in ("", ".gz"):
            path = folder / f"{stem}-{kind}{sep}idx{rank}-ubyte{suffix}"
            if path.is_file():
                return path
    raise GradleakError(f"{folder} has no {stem}-{kind}-idx{rank}-ubyte[.gz] file")


def read_idx_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images (N, H, W), int64 labels (N,)) of an MNIST-layout folder."""
    stem = "train" if split == "train" else "t10k"
    images_path = _find_idx(folder, stem, "images", 3)
    labels_path = _find_idx(folder, stem, "labels", 1)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise GradleakError(f"{images_path}: expected uint8 images (N, H, W), got "
                            f"{images.dtype} {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise GradleakError(f"{labels_path}: {labels.shape[0] if labels.ndim else 0} labels "
                            f"for {images.shape[0]} images in {images_path.name}")
    return images, labels.astype(np.int64)


def idx_dataset(name: str, images: np.ndarray, labels: np.ndarray,
                class_names: list[str]) -> Dataset:
    """Wrap uint8 (N, H, W) images and labels as a 1-channel Dataset."""
    if labels.size and (labels.min() < 0 or labels.max() >= len(class_names)):
        raise GradleakError(f"dataset '{name}': labels outside 0..{len(class_names) - 1}")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return Dataset(name, x, torch.from_numpy(labels), class_names)


def load_mnist_idx(spec: DatasetSpec) -> Dataset:
    """MNIST-layout IDX files (train-*/t10k-*, raw or .gz) from `:path=DIR`."""
    check_split(spec.name, spec.split)
    images, labels = read_idx_split(user_folder(spec), spec.split)
    n_classes = max(10, int(labels.max()) + 1 if labels.size else 0)
    return idx_dataset(spec.name, images, labels, [str(i) for i in range(n_classes)])


# --------------------------------------------------------------------------- CIFAR batches


def _str_keys(obj: Any, path: Path) -> dict[str, Any]:
    """CIFAR pickles come from Python 2: keys may be bytes; normalise them to str."""
    if not isinstance(obj, dict):
        raise GradleakError(f"{path}: expected a dict of arrays, got {type(obj).__name__}")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _load_batch(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return _str_keys(safe_unpickle(fh, encoding="bytes", source=str(path)), path)
    except OSError as exc:
        raise GradleakError(f"cannot read {path}: {exc.strerror or exc}") from None


def _names(values: Any, path: Path, key: str) -> list[str]:
    """Class names: a list of (byte) strings, nothing else."""
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, (str, bytes)) for v in values):
        raise InputFileError(f"{path}: '{key}' must be a list of class-name strings")
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]
    except UnicodeDecodeError:
        raise InputFileError(f"{path}: '{key}' holds class names that are not UTF-8") from None


def _label_array(value: Any, path: Path, key: str) -> np.ndarray:
    """A flat list or 1-D integer array of class indices (no NaN, nesting or mappings)."""
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                  for v in value):
        array = np.asarray(value, dtype=np.int64) if value else np.zeros(0, dtype=np.int64)
    else:
        raise InputFileError(f"{path}: '{key}' must be a flat list of integer class indices")
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise InputFileError(f"{path}: '{key}' must be a 1-D array of integer class indices, got "
                             f"{array.dtype} {array.shape}")
    return array.astype(np.int64)


def load_cifar_batches(spec: DatasetSpec) -> Dataset:
    """CIFAR-10 (data_batch_*, test_batch) or CIFAR-100 (train, test) python batches."""
    check_split(spec.name, spec.split)
    root = user_folder(spec)
    if (root / "data_batch_1").is_file() or (root / "test_batch").is_file():
        batches = [p for p in root.glob("data_batch_*") if p.name[11:].isdigit()]
        files = (sorted(batches, key=lambda p: int(p.name[11:]))
                 if spec.split == "train" else [root / "test_batch"])
        meta_path, names_key, label_key = root / "batches.meta", "label_names", "labels"
    elif (root / "train").is_file() or (root / "test").is_file():
        files = [root / spec.split]
        meta_path, names_key, label_key = root / "meta", "fine_label_names", "fine_labels"
    else:
        raise GradleakError(f"dataset '{spec.name}': {root} has neither CIFAR-10 batches "
                            "(data_batch_1..5, test_batch) nor CIFAR-100 files (train, test)")
    missing = [p for p in files if not p.is_file()] or ([] if files else [root / "data_batch_1"])
    if missing:
        raise GradleakError(f"dataset '{spec.name}': missing {missing[0]}")

    xs, ys = [], []
    for path in files:
        batch = _load_batch(path)
        if "data" not in batch or label_key not in batch:
            raise GradleakError(f"{path}: not a CIFAR batch (needs 'data' and '{label_key}')")
        data = batch["data"]
        if not isinstance(data, np.ndarray):
            raise InputFileError(f"{path}: 'data' must be a uint8 array, got {type(data).__name__}")
        labels = _label_array(batch[label_key], path, label_key)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise GradleakError(f"{path}: expected uint8 data of shape (N, 3072), got "
                                f"{data.dtype} {data.shape}")
        if labels.shape[0] != data.shape[0]:
            raise GradleakError(f"{path}: {labels.shape[0]} labels for {data.shape[0]} images")
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(labels)
    x, y = np.concatenate(xs), np.concatenate(ys)

    if meta_path.is_file():
        meta = _load_batch(meta_path)
        if names_key not in meta:
            raise GradleakError(f"{meta_path}: has no '{names_key}' entry")
        class_names = _names(meta[names_key], meta_path, names_key)
    else:  # no meta file: name the classes by index
        class_names = [str(i) for i in range(10 if label_key == "labels" else 100)]
    if y.size and (y.min() < 0 or y.max() >= len(class_names)):
        raise GradleakError(f"dataset '{spec.name}': labels outside 0..{len(class_names) - 1}")
    inputs = torch.from_numpy(x.astype(np.float32) / 255.0)
    return Dataset(spec.name, inputs, torch.from_numpy(y), class_names)


# --------------------------------------------------------------------------- image folders


# One user image may be large (it is resized as it is read), not absurd: PIL's own
# decompression-bomb limit is a warning below twice this.
MAX_IMAGE_PIXELS = 50_000_000


def _check_pixels(path: Path, size: tuple[int, int]) -> None:
    if size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise ResourceLimitError(f"image {path} has {size[0]}×{size[1]} pixels; the maximum is "
                                 f"{MAX_IMAGE_PIXELS:.3g} pixels")


def _check_complete(path: Path, fmt: str | None) -> None:
    """PIL decodes a PNG cut after its last pixel row without a word: a complete one ends
    with the IEND chunk (and its CRC)."""
    if fmt != "PNG":
        return
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 4096))
        tail = fh.read()
    end = tail.rfind(b"IEND")
    if end < 0 or len(tail) - end < 8:
        raise InputFileError(f"cannot read image {path}: the PNG file is truncated (no IEND chunk)")


def open_image(path: Path) -> Any:
    """Open an image with PIL, fully decoded, or fail with one line naming the file."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                _check_pixels(path, im.size)
                im.load()
                _check_complete(path, im.format)
                return im.copy() if im.mode != "P" else im.convert("RGBA")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as exc:
        raise InputFileError(f"cannot read image {path}: {exc}") from None


def is_gray(im: Any) -> bool:
    return im.mode in _GRAY_MODES


def image_to_array(im: Any, gray: bool, size: tuple[int, int] | None = None) -> np.ndarray:
    """PIL image -> float32 (C, H, W) in [0, 1]; `size` is (width, height) as PIL wants."""
    from PIL import Image

    if im.mode.startswith("I;16") or im.mode in ("I", "F"):
        arr = np.asarray(im, dtype=np.float32)
        scale = 65535.0 if im.mode != "F" else max(1.0, float(arr.max()))
        im = Image.fromarray(np.clip(arr / scale * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    im = im.convert("L" if gray else "RGB")
    if size is not None and im.size != size:
        im = im.resize(size, Image.Resampling.BICUBIC)
    arr = np.asarray(im, dtype=np.float32) / 255.0
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def _class_files(root: Path) -> dict[str, list[Path]]:
    """Sorted image files per class sub-folder of `root`."""
    classes = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(p for p in sub.iterdir()
                       if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if files:
            classes[sub.name] = files
    return classes


def split_per_class(n: int, split: str, seed: int = 0) -> list[int]:
    """Deterministic 80/20 split of n items (at least one test item once n >= 2)."""
    order = np.random.default_rng(seed).permutation(n)
    n_test = 0 if n < 2 else max(1, int(round(0.2 * n)))
    chosen = order[n_test:] if split == "train" else order[:n_test]
    return sorted(int(i) for i in chosen)


def _peek(path: Path) -> tuple[tuple[int, int], bool]:
    """(size, is_gray) from the image header only, without decoding pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            _check_pixels(path, im.size)
            _check_complete(path, im.format)  # cheap (the file's tail): every split sees the same files
            return im.size, is_gray(im)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InputFileError(f"cannot read image {path}: {exc}") from None


def _folder_splits(root: Path) -> tuple[list[str], dict[str, list[tuple[Path, int]]]]:
    """Class names and (path, label) lists of both splits, in a fixed order."""
    if (root / "train").is_dir() and (root / "test").is_dir():
        per_split = {split: _class_files(root / split) for split in ("train", "test")}
    else:
        listing = _class_files(root)
        per_split = {split: {name: [files[i] for i in split_per_class(len(files), split)]
                             for name, files in listing.items()} for split in ("train", "test")}
    names = sorted(set(per_split["train"]) | set(per_split["test"]))
    items = {split: [(path, names.index(name)) for name, files in sorted(classes.items())
                     for path in files] for split, classes in per_split.items()}
    return names, items


def load_image_folder(spec: DatasetSpec) -> Dataset:
    """root/CLASS/*.png|jpg|bmp, or root/train/CLASS and root/test/CLASS.

    Without train/ and test/ sub-roots each class is split 80/20 deterministically.
    Size and colour are decided over BOTH splits so train and test always match:
    every image takes the first image's size (or `resize`, when no crop comes
    first), and is RGB unless every image is grayscale.
    """
    check_split(spec.name, spec.split)
    root = user_folder(spec)
    names, items = _folder_splits(root)
    if not names:
        raise GradleakError(f"dataset '{spec.name}': {root} has no class sub-folders with "
                            "PNG/JPG/BMP images")
    if not items[spec.split]:
        raise GradleakError(f"dataset '{spec.name}': no images for split '{spec.split}' in {root}")

    headers = [_peek(path) for path, _ in items["train"] + items["test"]]
    gray = all(g for _, g in headers)
    size = headers[0][0]
    if spec.resize and spec.resize > 0 and not spec.crop:
        size = (spec.resize, spec.resize)
    chosen = items[spec.split]
    from .transforms import check_image_bytes

    check_image_bytes(spec.name, len(chosen), 1 if gray else 3, size[1], size[0])
    x = np.stack([image_to_array(open_image(path), gray, size) for path, _ in chosen])
    y = np.array([label for _, label in chosen], dtype=np.int64)
    return Dataset(spec.name, torch.from_numpy(x), torch.from_numpy(y), names)
