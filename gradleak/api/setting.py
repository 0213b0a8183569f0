"""`Setting`: what an audit attacked — the data, the model, the client's training and the
server's view — as `AuditResult.setting` records it (its summary line, its store rows' scenario
labels and digests, its JSON). Simulated audits (`audit`), captured updates (`audit_update`)
and a Flower audit's rounds (`gradleak.flower.attacking`) all build it. The caller, which holds
the model and the examples, takes their digests (`models.base.model_digest`,
`data.base.data_digest`) and its own time: the objects are not handed back up to `api`."""
from __future__ import annotations

from dataclasses import dataclass

from ..fl import TrainingSpec
from ..fl.training_check import TrainingCheck
from .inputs import defense_labels


@dataclass(frozen=True)
class Setting:
    """One audit's setting. `seeds` is given by a simulated audit (which may run several),
    `seconds` (its time so far) by an audit that times itself; an audit of a captured update
    records its declared-training check (`captured`), None when the check could not run."""

    dataset: str
    model: str
    batch_size: int
    training: TrainingSpec
    seed: int
    threat: str
    budget: str
    defenses: tuple[str, ...]
    model_digest: str
    data_digest: str
    seeds: tuple[int, ...] | None = None
    seconds: float | None = None
    captured: bool = False
    training_check: TrainingCheck | None = None

    def as_dict(self) -> dict:
        """`AuditResult.setting`: the keys in the order its JSON has always had them."""
        out: dict = {"dataset": self.dataset, "model": self.model, "batch_size": self.batch_size,
                     "local_steps": self.training.num_steps(self.batch_size),
                     "local_epochs": self.training.local_epochs, "lr": self.training.lr, "seed": self.seed}
        if self.seeds is not None:
            out["seeds"] = list(self.seeds)
        out.update({"threat": self.threat, "budget": self.budget, "defenses": list(self.defenses),
                    **defense_labels(self.defenses), "model_digest": self.model_digest,
                    "data_digest": self.data_digest})
        if self.seconds is not None:
            out["seconds"] = self.seconds
        if self.captured:
            out["training_check"] = self.training_check.to_dict() if self.training_check is not None else None
        return out
