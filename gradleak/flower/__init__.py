"""Audit a Flower app: the updates its server receives, attacked by gradleak.

`FlowerAudit` is the hook (a client mod and a strategy wrapper); `run_app`
runs an app directory as a Flower simulation with the audit on, and `gradleak
flower APP_DIR` is its command line. Needs `flwr[simulation]` (pinned in
requirements-extras.txt, which `make test` and `make install` add). See docs/flower.md.
"""
from __future__ import annotations

from .hook import CapturedUpdate, FlowerAudit

__all__ = ["FlowerAudit", "CapturedUpdate", "run_app"]


def run_app(*args, **kwargs):
    """See `gradleak.flower.runner.run_app`."""
    from .runner import run_app as _run_app

    return _run_app(*args, **kwargs)
