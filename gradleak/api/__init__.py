"""The public Python API: how much of *your* client's data leaks.

`audit` takes the user's own model (an `nn.Module`, a factory, or a model
reference such as `"lenet"` or `"my_model.py:Net"`) and the client's data (a
torch `Dataset`, a `DataLoader`, `(inputs, labels)` tensors, or a dataset
reference such as `"mnist"`), simulates the client's training with the
defenses applied where a real client applies them, and runs every attack the
threat model allows on it. `audit_update` does the same for an update captured
from a running federation (see `gradleak.flower`).

Both return an `AuditResult`: one `AttackRunResult` per attack that ran, and
every attack that did not, with a one-line reason.

One job per module: `simulated` (audit), `captured` (audit_update), `result` (AuditResult and
its store rows), `selection` (attacks, budgets and skip reasons), `inputs` (seeds, gallery,
artifacts, digests); the declared-training check lives beside the client code it replays
(`gradleak.fl.training_check`).
"""
from __future__ import annotations

from ..fl.training_check import (
    TRAINING_CHECK_TOLERANCE,
    TrainingCheck,
    TrainingMismatchWarning,
    check_declared_training,
)
from .captured import audit_update
from .result import AuditResult
from .selection import BUDGET_DOUBLINGS, BUDGETS, SkippedAttack, budget_options, select_attacks
from .simulated import audit

__all__ = ["audit", "audit_update", "AuditResult", "SkippedAttack", "select_attacks", "BUDGETS",
           "TrainingCheck", "TrainingMismatchWarning", "check_declared_training",
           # also importable from here, as before the split
           "BUDGET_DOUBLINGS", "TRAINING_CHECK_TOLERANCE", "budget_options"]
