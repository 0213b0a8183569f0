"""Name → component registries.

Entries are dotted paths ("gradleak.attacks.ig:InvertingGradients") imported on
first use, so listing names is instant and adding a component touches its own
module plus one line in the registry table.
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Generic, Iterator, TypeVar

from .errors import GradleakError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, entries: dict[str, str]):
        self.kind = kind
        self._paths = dict(entries)
        self._loaded: dict[str, Any] = {}

    def names(self) -> list[str]:
        return list(self._paths)

    def __contains__(self, name: str) -> bool:
        return name in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def get(self, name: str) -> T:
        if name not in self._paths:
            close = difflib.get_close_matches(name, self._paths, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise GradleakError(
                f"unknown {self.kind} '{name}'{hint}; choose from: {', '.join(self._paths)}"
            )
        if name not in self._loaded:
            module_name, _, attr = self._paths[name].partition(":")
            self._loaded[name] = getattr(importlib.import_module(module_name), attr)
        return self._loaded[name]

    def summary(self, name: str) -> str:
        obj = self.get(name)
        doc = (getattr(obj, "summary", None) or obj.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""
