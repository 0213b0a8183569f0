"""Saving and loading model weights without executing untrusted code.

`.safetensors` files hold raw tensors only; any other suffix is a torch
state_dict read with `weights_only=True`, which refuses pickled globals (the
classic `__reduce__` → `os.system` payload). Every failure is one GradleakError line.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import GradleakError
from ..options import path_kind


def _is_safetensors(path: Path) -> bool:
    return path.suffix.lower() == ".safetensors"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def save_checkpoint(model: nn.Module, path: str | Path) -> Path:
    """Write the model's state_dict (safetensors if the suffix says so, else torch.save)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    try:
        if _is_safetensors(path):
            from safetensors.torch import save_file

            # clone() breaks storage sharing, which safetensors refuses to write
            save_file({k: v.clone() for k, v in state.items()}, str(path))
        else:
            torch.save(state, path)
    except OSError as exc:
        raise GradleakError(f"cannot write checkpoint '{path}': {_first_line(exc)}") from None
    return path


def _read(path: Path) -> dict[str, torch.Tensor]:
    if _is_safetensors(path):
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # SafetensorError, OSError, ...: all mean "not a valid file"
            raise GradleakError(f"checkpoint '{path}' is not a valid safetensors file ({_first_line(exc)})") from None
    try:
        with warnings.catch_warnings():  # a rejected file's pickle-protocol warning would add lines
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for forbidden globals, RuntimeError/EOFError for corrupt files
        raise GradleakError(
            f"checkpoint '{path}' was rejected: not a plain weights file ({_first_line(exc)})"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise GradleakError(f"checkpoint '{path}' does not hold a state_dict of tensors")
    return state


def load_checkpoint(model: nn.Module, path: str | Path) -> nn.Module:
    """Load weights into `model` in place (and return it); the keys and shapes must match exactly."""
    path = Path(path)
    if path_kind(path, "checkpoint") != "file":
        raise GradleakError(f"checkpoint '{path}' not found")
    state = _read(path)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [f"{k} {tuple(state[k].shape)} vs model {tuple(v.shape)}"
                  for k, v in expected.items() if k in state and state[k].shape != v.shape]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} keys (e.g. {', '.join(missing[:3])})")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} keys (e.g. {', '.join(unexpected[:3])})")
    if mismatched:
        problems.append(f"shape mismatch: {'; '.join(mismatched[:3])}")
    if problems:
        raise GradleakError(f"checkpoint '{path}' does not fit this model: {'; '.join(problems)}")
    model.load_state_dict(state, strict=True)
    return model
