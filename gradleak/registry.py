"""Name → component registries.

Entries are dotted paths ("gradleak.attacks.optimization.ig:InvertingGradients") imported on
first use, so listing names is instant and adding a component touches its own
module plus one line in the registry table.

Code outside gradleak adds components in two ways:
- `ATTACKS.register("my-attack", MyAttack)` (or a "module:attr" path) at run time;
- a Python entry point in the group `gradleak.attacks`, `gradleak.defenses`,
  `gradleak.models`, `gradleak.datasets`, `gradleak.modalities`, `gradleak.optimizers` (the
  client optimizers replayed) or `gradleak.generators` (the deep image prior's generators) of
  an installed package, e.g. in its
  pyproject.toml: `[project.entry-points."gradleak.defenses"] halve = "my_pkg:Halve"`.
A component's `name` attribute, when it has one, must equal its registry key.
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Generic, Iterator, TypeVar

from .errors import GradleakError

T = TypeVar("T")


def import_reference(reference: str):
    """The object a "module:attribute" reference names (registry entries, `Modality.scorer`)."""
    module_name, _, attr = reference.partition(":")
    return getattr(importlib.import_module(module_name), attr)


class Registry(Generic[T]):
    def __init__(self, kind: str, entries: dict[str, str], group: str | None = None):
        self.kind = kind
        self.group = group or f"gradleak.{kind}s"  # entry-point group of plugin packages
        self._paths: dict[str, Any] = dict(entries)
        self._builtin = frozenset(entries)
        self._loaded: dict[str, Any] = {}
        self._plugins_read = False

    def register(self, name: str, component: Any, *, replace: bool = False) -> None:
        """Add a component under `name`: the object itself or a "module:attr" path
        imported on first use. A built-in name cannot be replaced; a name added
        earlier only with `replace=True`."""
        if not isinstance(name, str) or not name or any(c in name for c in ":,= "):
            raise GradleakError(f"a {self.kind} name must be a non-empty string without ':', ',', '=' "
                                f"or spaces, got {name!r}")
        self._read_plugins()
        if name in self._builtin:
            raise GradleakError(f"'{name}' is a built-in {self.kind}; register yours under another name")
        if name in self._paths and not replace:
            raise GradleakError(f"{self.kind} '{name}' is already registered (pass replace=True to replace it)")
        if not isinstance(component, str):
            self._check_name(name, component)
        self._paths[name] = component
        self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        """Remove a component that is not built in: one a test registered, which must not
        outlive it."""
        self._read_plugins()
        if name in self._builtin:
            raise GradleakError(f"'{name}' is a built-in {self.kind}; it cannot be removed")
        if name not in self._paths:
            raise GradleakError(f"{self.kind} '{name}' is not registered")
        del self._paths[name]
        self._loaded.pop(name, None)

    def _read_plugins(self) -> None:
        """Entry points of installed packages, read once, on first use."""
        if self._plugins_read:
            return
        self._plugins_read = True
        from importlib.metadata import entry_points

        for point in entry_points(group=self.group):
            if point.name in self._paths:
                where = getattr(point.dist, "name", "an installed package")
                raise GradleakError(f"{where} declares {self.kind} '{point.name}' (entry point group "
                                    f"'{self.group}'), a name gradleak already has")
            self._paths[point.name] = point.value

    def _check_name(self, name: str, component: Any) -> None:
        declared = getattr(component, "name", None)
        if isinstance(declared, str) and declared != name:
            raise GradleakError(f"{self.kind} registered as '{name}' calls itself '{declared}'; "
                                "its `name` must equal its registry key")

    def names(self) -> list[str]:
        self._read_plugins()
        return list(self._paths)

    def __contains__(self, name: str) -> bool:
        self._read_plugins()
        return name in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        self._read_plugins()
        if name not in self._paths:
            close = difflib.get_close_matches(name, self._paths, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise GradleakError(
                f"unknown {self.kind} '{name}'{hint}; choose from: {', '.join(self._paths)}"
            )
        if name not in self._loaded:
            entry = self._paths[name]
            if isinstance(entry, str):
                try:
                    component = import_reference(entry)
                except Exception as exc:  # a plugin's own import error, reported in one line
                    raise GradleakError(f"{self.kind} '{name}' could not be loaded from '{entry}': "
                                        f"{type(exc).__name__}: {exc}") from None
            else:
                component = entry
            self._check_name(name, component)
            self._loaded[name] = component
        return self._loaded[name]

    def summary(self, name: str) -> str:
        obj = self.get(name)
        doc = (getattr(obj, "summary", None) or obj.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""
