"""`gradleak list [attacks|defenses|datasets|models]`."""
from __future__ import annotations

import argparse

KINDS = ("attacks", "defenses", "datasets", "models")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", nargs="?", choices=KINDS, help="what to list (default: everything)")


def _registry(kind: str):
    if kind == "attacks":
        from ..attacks import ATTACKS
        return ATTACKS
    if kind == "defenses":
        from ..defenses import DEFENSES
        return DEFENSES
    if kind == "datasets":
        from ..data import DATASETS
        return DATASETS
    from ..models import MODELS
    return MODELS


def run(args: argparse.Namespace) -> int:
    kinds = [args.kind] if args.kind else list(KINDS)
    for kind in kinds:
        registry = _registry(kind)
        if len(kinds) > 1:
            print(f"{kind}:")
        for name in registry.names():
            try:
                summary = registry.summary(name)
            except Exception as exc:  # a component that cannot be imported is still listed, with why
                summary = f"(cannot be loaded: {exc})"
            print(f"{'  ' if len(kinds) > 1 else ''}{name:18s} {summary}")
    return 0
