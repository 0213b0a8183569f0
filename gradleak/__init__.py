"""gradleak: how much of a federated-learning client's data can the server reconstruct?

The public API is `gradleak.audit` (your model and data, simulated client) and
`gradleak.audit_update` (an update captured from a running federation); both
live in `gradleak.api`. Importing `gradleak` alone loads nothing heavy.
"""
from __future__ import annotations

__all__ = ["audit", "audit_update", "AuditResult", "SkippedAttack"]


def __getattr__(name: str):
    if name in __all__:
        import importlib

        return getattr(importlib.import_module("gradleak.api"), name)
    raise AttributeError(f"module 'gradleak' has no attribute {name!r}")
