"""gradleak's client-side guard for this app, on with `--run-config guard=true`: a model
crafted to leak is refused before training, and each update is audited (DAGER's span test,
then TAG) against the client's own sequences, re-identified among held-out news windows
(a client holds no other sequences), and sent under the weakest rung of the noise ladder that
passes, or not at all (docs/guard.md)."""
from __future__ import annotations

from flower_text.audit import audit
from flower_text.task import held_out_sequences
from gradleak.flower.guard import FlowerGuard

guard = FlowerGuard.from_audit(audit, gallery=lambda context: held_out_sequences(200))
