"""Parsing `NAME[:key=value,...]` specs into typed option dataclasses.

Every attack, defense and model declares its options as a dataclass; this
module turns the CLI's strings into those types and names the bad key or value
in one line when something is wrong. The bounds each numeric option is kept within live in
`limits`.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
import typing
from typing import Any, Callable, Iterable, Literal, get_args, get_origin, get_type_hints

from ..errors import GradleakError
from .limits import MAX_COUNT, MAX_MAGNITUDE, NAME_RANGES, check_range


def field_range(field: dataclasses.Field, annotation: Any) -> tuple[float, float] | None:
    """The (lo, hi) bounds of a numeric option field (both inclusive), or None for other types."""
    declared = field.metadata.get("range") if field.metadata else None
    if declared is not None:
        return declared
    if _numeric_kind(annotation) is None:
        return None
    for pattern, bounds in NAME_RANGES:
        if fnmatch.fnmatchcase(field.name, pattern):
            return bounds
    return (-MAX_COUNT, MAX_COUNT) if _numeric_kind(annotation) is int else (-MAX_MAGNITUDE, MAX_MAGNITUDE)


def _numeric_kind(annotation: Any) -> type | None:
    """int or float for a (possibly optional, possibly tuple-of) numeric annotation."""
    if annotation in (int, float):
        return annotation
    origin = get_origin(annotation)
    if origin is not None and origin is not Literal:
        for arg in get_args(annotation):
            if arg is not type(None) and arg is not Ellipsis:
                kind = _numeric_kind(arg)
                if kind is not None:
                    return kind
    return None


@dataclasses.dataclass(frozen=True)
class ComponentSpec:
    """A registry name plus raw option strings, e.g. `ig:restarts=2`."""

    name: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.options.items())


def parse_pairs(text: str | Iterable[str], bad_pair: Callable[[str], str], *,
                repeated: Callable[[str], str] | None = None,
                key: Callable[[str], str | None] = str.strip) -> dict[str, str]:
    """The one `key=value` parser: the pairs of one comma-separated text, or of a list of
    single pairs (whose values may hold commas), keys and values stripped.

    `bad_pair(item)` is the one-line message for an item that is not `key=value`; `key` maps a
    key to its stored form (None: the item is bad); `repeated(key)` the message for a key
    given twice (None: the last one given counts)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    pairs: dict[str, str] = {}
    for item in items:
        raw_key, eq, value = item.partition("=")
        name = key(raw_key.strip()) if eq else None
        if not name:
            raise GradleakError(bad_pair(item))
        if repeated is not None and name in pairs:
            raise GradleakError(repeated(name))
        pairs[name] = value.strip()
    return pairs


def parse_spec(text: str, kind: str) -> ComponentSpec:
    """Parse `name:k=v,k2=v2` (the CLI form)."""
    text = text.strip()
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if not name:
        raise GradleakError(f"empty {kind} name in '{text}'")
    options: dict[str, Any] = {}
    if rest.strip():
        options.update(parse_pairs(
            rest, lambda item: f"bad {kind} option '{item}' in '{text}': expected key=value",
            repeated=lambda key: f"{kind} option '{key}' given twice in '{text}'",
            key=lambda key: key.replace("-", "_")))
    return ComponentSpec(name, options)


def parse_chain(texts: Iterable[str]) -> tuple[ComponentSpec, ...]:
    """A defense chain's texts (`clip:bound=1`, `noise:sigma=0.01`), each parsed."""
    return tuple(parse_spec(text, "defense") for text in texts)


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = get_origin(annotation)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return _coerce(value, args[0], where)
    if origin is Literal:
        choices = get_args(annotation)
        if isinstance(value, str):
            for choice in choices:
                if str(choice).lower() == value.lower():
                    return choice
        elif value in choices:
            return value
        raise GradleakError(f"{where}: '{value}' is not one of {', '.join(map(str, choices))}")
    if origin in (tuple, list):
        (item_type, *_rest) = get_args(annotation) or (str,)
        items = value.split(";") if isinstance(value, str) else list(value)
        items = [i for i in items if str(i).strip() != ""]
        return origin(_coerce(i, item_type, where) for i in items)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        lowered = str(value).lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise GradleakError(f"{where}: '{value}' is not a boolean (true/false)")
    if annotation is int:
        if isinstance(value, bool) or not _ascii_number(value):
            raise GradleakError(f"{where}: '{value}' is not an integer")
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise GradleakError(f"{where}: '{value}' is not an integer") from None
        if not math.isfinite(as_float) or as_float != int(as_float):
            raise GradleakError(f"{where}: '{value}' is not an integer")
        return int(as_float)
    if annotation is float:
        if not _ascii_number(value):
            raise GradleakError(f"{where}: '{value}' is not a number")
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise GradleakError(f"{where}: '{value}' is not a number") from None
        if math.isnan(result):
            raise GradleakError(f"{where}: NaN is not allowed")
        return result
    if annotation is str:
        return str(value)
    return value


def _ascii_number(value: Any) -> bool:
    """Python's float() also reads other scripts' digits ("٣"): option values are written in ASCII."""
    return not isinstance(value, str) or value.isascii()


def build_options(cls: type, raw: dict[str, Any], owner: str) -> Any:
    """Instantiate option dataclass `cls` from raw (string or typed) values.

    Unknown keys and values of the wrong type raise GradleakError naming
    `owner` (e.g. "attack 'ig'") and the valid keys.
    """
    if cls is None:
        if raw:
            raise GradleakError(f"{owner} takes no options (got {', '.join(raw)})")
        return None
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    values = {}
    for key, value in raw.items():
        norm = key.replace("-", "_")
        if norm not in fields:
            raise GradleakError(
                f"{owner} has no option '{key}'; valid options: {', '.join(sorted(fields)) or 'none'}"
            )
        where = f"{owner} option '{norm}'"
        values[norm] = _coerce(value, hints[norm], where)
        bounds = field_range(fields[norm], hints[norm])
        if bounds is not None:
            check_range(values[norm], bounds, where)
    try:
        return cls(**values)
    except GradleakError:
        raise
    except (TypeError, ValueError) as exc:
        raise GradleakError(f"{owner}: {exc}") from None


def check(condition: bool, message: str) -> None:
    """Option validation helper for `__post_init__`."""
    if not condition:
        raise GradleakError(message)


def options_dict(options: Any) -> dict[str, Any]:
    return dataclasses.asdict(options) if options is not None else {}
