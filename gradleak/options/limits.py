"""The limits on run values and their checks: the bounds of every numeric option and scenario
field, the sizes refused before anything is allocated, the device names and the input and output
paths a run may use, each refused in one line; with the argparse types that apply them on the
command line.
"""
from __future__ import annotations

import argparse
import math
from typing import Any

from ..errors import GradleakError, OptionRangeError

# Bounds every numeric option gets, so that an absurd value is refused where it is
# parsed instead of reaching PyTorch (an overflow, a NaN, terabytes to allocate or a
# run that never ends). A field may declare its own bounds with
# `field(default=..., metadata={"range": (lo, hi)})`; otherwise the first matching
# name pattern below applies, else the bound of its type. docs/options.md lists them.
MAX_COUNT = 1_000_000          # any integer option
MAX_MAGNITUDE = 1e6            # |value| of any real option; NaN and infinity are always refused
MAX_ITERATIONS = 100_000       # optimisation iterations and steps
MAX_SEED = 2**32 - 1
MAX_WORKERS = 1024             # local worker processes (demo / sweep --workers)
MAX_SWEEP_CELLS = 100_000      # cells of one sweep file (each is at least one attack run)
MAX_BATCH = 4096               # client batch and local mini-batch sizes
MAX_IMAGES = 1_000_000         # images attacked in one scenario (the dataset size is the real bound)
MAX_LR = 1000.0                # the client's learning rate
MAX_LOCAL_EPOCHS = 10_000
NAME_RANGES: tuple[tuple[str, tuple[float, float]], ...] = (
    ("seed", (0, MAX_SEED)),
    ("*seed", (0, MAX_SEED)),
    ("iterations", (0, MAX_ITERATIONS)),
    ("*steps", (0, MAX_ITERATIONS)),
    ("refine", (0, MAX_ITERATIONS)),
    ("inner", (0, 10_000)),
    ("restarts", (0, 1_000)),
    ("starts", (0, 1_000)),
    ("history*", (0, 10_000)),
    ("lr", (0, 1_000)),
    ("*_lr", (0, 1_000)),
    ("*_db", (-300, 300)),
)


def _fmt(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def check_range(value: Any, bounds: tuple[float, float], where: str) -> None:
    """Refuse a number (or each number of a tuple) outside [lo, hi], or not finite."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, (tuple, list)):
        for item in value:
            check_range(item, bounds, where)
        return
    if not isinstance(value, (int, float)):
        return
    lo, hi = bounds
    if isinstance(value, float) and not math.isfinite(value):
        raise OptionRangeError(f"{where} = {value} is not a finite number; allowed: {_fmt(lo)} to {_fmt(hi)}")
    if not lo <= value <= hi:
        shown = f"{value:g}" if isinstance(value, float) else (str(value) if abs(value) < 10**21 else f"{value:.3g}")
        raise OptionRangeError(f"{where} = {shown} is out of range; allowed: {_fmt(lo)} to {_fmt(hi)}")


def ranged(kind: type, lo: float, hi: float, option: str):
    """An argparse `type=` that parses an int or float and keeps it within [lo, hi]."""
    def parse(text: str):
        where = f"{option}"
        if not text.isascii():
            raise argparse.ArgumentTypeError(f"'{text}' is not {'a number' if kind is float else 'an integer'}")
        try:
            number = float(text) if kind is float else _parse_int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {'a number' if kind is float else 'an integer'}") \
                from None
        if kind is float and math.isnan(number):
            raise argparse.ArgumentTypeError("NaN is not allowed")
        try:
            check_range(number, (lo, hi), where)
        except OptionRangeError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{where} = ")) from None
        return number
    parse.__name__ = "integer" if kind is int else "number"  # argparse names the type in its message
    return parse


def _parse_int(text: str) -> int:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        as_float = float(text)  # "1e3" is accepted when it is a whole number
        if not math.isfinite(as_float) or as_float != int(as_float):
            raise ValueError(text) from None
        return int(as_float)


# Sizes refused before anything is allocated (docs/options.md): a model or a batch that
# would need more memory than a workstation has fails with one line saying how much.
MAX_PARAMETERS = 250_000_000           # trainable parameters of a model (1 GB of float32 weights)
MAX_ACTIVATIONS = 100_000_000          # activations of one example through a model (400 MB)
MAX_DATA_BYTES = 4 * 2**30             # a dataset's images after crop / resize, as float32
MIN_IMAGE_SIDE, MAX_IMAGE_SIDE = 8, 1024  # --resize / crop (SSIM needs a few pixels)

# Bounds of the scenario fields (AttackRunSpec), shared by its own check and the command line.
MAX_DOUBLINGS = 10                     # budget-ladder doublings of an attack (2^10 × its first budget)
RUN_SPEC_BOUNDS: dict[str, tuple[float, float]] = {
    "batch_size": (1, MAX_BATCH), "images": (1, MAX_IMAGES), "local_steps": (1, MAX_ITERATIONS),
    "local_epochs": (1, MAX_LOCAL_EPOCHS), "local_batch_size": (1, MAX_BATCH), "lr": (0.0, MAX_LR),
    "seed": (0, MAX_SEED), "pretrain_steps": (0, MAX_ITERATIONS), "resize": (MIN_IMAGE_SIDE, MAX_IMAGE_SIDE),
    "doublings": (0, MAX_DOUBLINGS), "shuffle_seed": (0, MAX_SEED),
    "crop_padding": (0, 64), "label_smoothing": (0.0, 0.999), "clip_norm": (0.0, MAX_LR * 1e6),
    "seq_len": (1, 1024),  # GPT-2's context
}
MAX_CLASSES = 100_000                  # classes a user's labels may imply


def human_bytes(count: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if count < 1024 or unit == "PB":
            return f"{count:.3g} {unit}" if unit != "bytes" else f"{int(count)} bytes"
        count /= 1024
    return f"{count:.3g} PB"  # pragma: no cover


def check_size(what: str, count: int, limit: int, unit: str, bytes_each: int = 4) -> None:
    """Refuse `count` items (parameters, activations, ...) above `limit`, naming the memory needed."""
    if count > limit:
        from ..errors import ResourceLimitError

        raise ResourceLimitError(f"{what} needs {count:.3g} {unit} ({human_bytes(count * bytes_each)}); "
                                 f"the maximum is {limit:.3g} {unit}")


def check_device(name: str, available: bool = True) -> str:
    """`auto`, `cpu` or `cuda[:N]` naming a GPU this machine has; anything else is a DeviceError.
    With `available=False` only the form is checked (a sweep whose cells may run elsewhere)."""
    import re

    from ..errors import DeviceError

    text = (name or "").strip().lower()
    if text in ("auto", "cpu"):
        return text
    match = re.fullmatch(r"cuda(?::(\d{1,3}))?", text)
    if not match:
        raise DeviceError(f"unknown device '{name}'; use auto, cpu or cuda[:N]")
    if not available:
        return text
    import torch

    if not torch.cuda.is_available():
        raise DeviceError(f"device '{name}' requested but no GPU is available")
    if match.group(1) is not None and int(match.group(1)) >= torch.cuda.device_count():
        raise DeviceError(f"device '{name}': this machine has {torch.cuda.device_count()} GPU(s)")
    return text


def device_name(text: str) -> str:
    """argparse `type=` for --device (see `check_device`)."""
    try:
        return check_device(text)
    except GradleakError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def path_kind(path: Any, what: str) -> str | None:
    """What a user's input path names — "file", "dir" or "other" — or None when nothing is
    there. A path the file system cannot even look up (a name longer than it allows, a loop
    of links, a folder it may not enter, a NUL byte) is one line naming `what`, not an OSError."""
    import os
    import stat

    from ..errors import InputFileError

    shown = str(path) if len(str(path)) <= 80 else str(path)[:77] + "..."
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise InputFileError(f"{what} '{shown}' cannot be used: {reason}") from None
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


# Output paths are checked when they are parsed, before any work starts.
MAX_PATH_CHARS, MAX_NAME_CHARS = 4096, 255


def check_output_path(text: str, option: str, folder: bool) -> Any:
    """An output folder (or file) that can be created or written: not an existing file where a
    folder is wanted (or the reverse), no over-long name, a writable nearest existing parent."""
    import os
    from pathlib import Path

    from ..errors import OutputPathError

    if not text or "\x00" in text:
        raise OutputPathError(f"{option}: '{text}' is not a usable path")
    path = Path(text).expanduser()
    if len(str(path)) > MAX_PATH_CHARS or any(len(part.encode()) > MAX_NAME_CHARS for part in path.parts):
        raise OutputPathError(f"{option}: path is too long ({len(str(path))} characters)")
    if folder and path.exists() and not path.is_dir():
        raise OutputPathError(f"{option} {path} exists and is not a folder")
    if not folder and path.is_dir():
        raise OutputPathError(f"{option} {path} is a folder, expected a file")
    parent = path if folder else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    parent = parent if str(parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise OutputPathError(f"{option} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{option} {path}: {parent} is not writable")
    if not folder and path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"{option} {path} is not writable")
    return path


def _output_path_type(option: str, folder: bool):
    def parse(text: str) -> str:
        try:
            return str(check_output_path(text, option, folder=folder))
        except GradleakError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{option} ").removeprefix(f"{option}: ")) \
                from None
    parse.__name__ = "folder" if folder else "file"
    return parse


def output_dir(option: str = "--out"):
    """argparse `type=` for an output folder (see `check_output_path`)."""
    return _output_path_type(option, folder=True)


def output_file(option: str = "--out"):
    """argparse `type=` for an output file (see `check_output_path`)."""
    return _output_path_type(option, folder=False)
