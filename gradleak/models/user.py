"""Models from the user's own code: `path/to/file.py:factory[:k=v,...]` or
`package.module:factory[:k=v,...]`.

Importing the user's file runs their code, as pytest runs a test file: that is
the point (their architecture, their forward). Everything around it is checked:
a file that fails to import, a factory that is missing, raises, or returns no
`nn.Module`, and a model whose output does not fit the data's classes each stop
with one line.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import GradleakError
from ..modalities import modality as modality_of
from ..options import parse_pairs, path_kind

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Arguments the factory gets from the data when its signature names them.
_SHAPE_ARGUMENTS = ("num_classes", "input_shape", "in_channels")


def is_user_model_ref(text: str) -> bool:
    """True for `file.py:factory...` and `package.module:factory...`; built-in
    names (`lenet`, `convnet:width=64`) contain neither a dot nor a path separator."""
    source = text.strip().split(":", 1)[0]
    if source.endswith(".py") or "/" in source or "\\" in source:
        return True
    return bool(_DOTTED.match(source))


def parse_user_model_ref(text: str) -> tuple[str, str, dict[str, Any]]:
    """(source, factory name, keyword arguments) of a user model reference."""
    parts = text.strip().split(":", 2)
    if len(parts) < 2 or not parts[1].strip():
        raise GradleakError(f"model '{text}': name the factory, e.g. '{parts[0]}:build_model'")
    source, factory = parts[0].strip(), parts[1].strip()
    if not _IDENTIFIER.match(factory):
        raise GradleakError(f"model '{text}': '{factory}' is not a Python name")
    kwargs: dict[str, Any] = {}
    if len(parts) == 3 and parts[2].strip():
        pairs = parse_pairs(parts[2], lambda item: f"model '{text}': bad argument '{item}', expected key=value",
                            repeated=lambda key: f"model '{text}': argument '{key}' given twice",
                            key=lambda key: key if _IDENTIFIER.match(key) else None)
        kwargs = {key: _literal(value) for key, value in pairs.items()}
    return source, factory, kwargs


def build_user_model(text: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0) -> nn.Module:
    """Import the user's factory, call it (seeded) and return the model, float32 in train mode."""
    source, name, kwargs = parse_user_model_ref(text)
    module = _import_file(source) if (source.endswith(".py") or "/" in source or "\\" in source) \
        else _import_module(source)
    factory = getattr(module, name, None)
    if factory is None:
        raise GradleakError(f"model '{text}': {source} has no '{name}'")
    if not callable(factory):
        raise GradleakError(f"model '{text}': '{name}' in {source} is not callable")
    kwargs = {**_shape_arguments(factory, tuple(input_shape), num_classes, kwargs), **kwargs}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            model = factory(**kwargs)
        except GradleakError:
            raise
        except BaseException as exc:  # the user's code: SystemExit and friends too
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise GradleakError(f"model '{text}': {name}({_show(kwargs)}) raised "
                                f"{type(exc).__name__}: {_first_line(exc)}") from None
    if not isinstance(model, nn.Module):
        raise GradleakError(f"model '{text}': {name}() returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise GradleakError(f"model '{text}': the model has no parameters to train")
    return model.float().train()


def check_model_fits(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, where: str = "model",
                     *, modality: str) -> int:
    """Run one zero example of the modality's input type through `model` (its state untouched):
    the output must be (1, K) logits with K >= num_classes, or (1, T, K) next-token logits for
    token sequences of length T. Returns K."""
    kind = modality_of(modality)
    training = model.training
    saved = {n: b.clone() for n, b in model.named_buffers()}
    try:
        model.eval()
        with torch.no_grad():
            out = model(kind.example(tuple(input_shape)))
    except GradleakError:
        raise
    except Exception as exc:
        raise GradleakError(f"{where} cannot take inputs of shape {tuple(input_shape)}{kind.model_hint}: "
                            f"{type(exc).__name__}: {_first_line(exc)}") from None
    finally:
        model.train(training)
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
    per_token = kind.reads_per_position(out, tuple(input_shape))
    if not isinstance(out, torch.Tensor) or (out.dim() != 2 and not per_token) or out.shape[0] != 1:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise GradleakError(f"{where} must return (batch, classes) logits; for one input of shape "
                            f"{tuple(input_shape)} it returned {shape}")
    width = int(out.shape[-1])
    if width < num_classes:
        raise GradleakError(f"{where} outputs {width} logits but the data has {num_classes} classes")
    return width


def _import_file(source: str):
    path = Path(source).expanduser()
    if path.suffix != ".py":
        raise GradleakError(f"model file '{path}' is not a .py file")
    if path_kind(path, "model file") != "file":
        raise GradleakError(f"model file '{path}' not found")
    resolved = path.resolve()
    # One module name per file, so two files called model.py do not collide.
    module_name = "gradleak_user_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise GradleakError(f"model file '{path}' cannot be imported")
    module = importlib.util.module_from_spec(spec)
    # The file's folder is importable while it loads (for its sibling modules), as for a script.
    sys.path.insert(0, str(resolved.parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise GradleakError(f"model file '{path}' failed to import: {type(exc).__name__}: "
                            f"{_first_line(exc)}") from None
    finally:
        try:
            sys.path.remove(str(resolved.parent))
        except ValueError:
            pass
    return module


def _import_module(source: str):
    try:
        return importlib.import_module(source)
    except ModuleNotFoundError as exc:
        raise GradleakError(f"model module '{source}' not found ({_first_line(exc)})") from None
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise GradleakError(f"model module '{source}' failed to import: {type(exc).__name__}: "
                            f"{_first_line(exc)}") from None


def _shape_arguments(factory, input_shape, num_classes, given) -> dict[str, Any]:
    """num_classes / input_shape / in_channels for a factory whose signature names them."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    available = {"num_classes": num_classes, "input_shape": tuple(input_shape),
                 "in_channels": input_shape[0] if len(input_shape) == 3 else None}
    return {k: available[k] for k in _SHAPE_ARGUMENTS
            if k in params and k not in given and available[k] is not None}


def _literal(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value
    return parsed if isinstance(parsed, (int, float, str, tuple)) else value


def _show(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else ""
