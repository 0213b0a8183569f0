"""Reading a store's cells: the scenario a cell belongs to, how its budget ladder ended,
and means with their intervals over seeds."""
from __future__ import annotations

import math
from statistics import mean, stdev

from ..store import CellRecord

# A verdict never mixes threat models: what a malicious server gets says nothing about
# an honest one, so the threat model is part of every scenario.
SCENARIO_KEYS = ("threat", "dataset", "model", "batch_size", "local_steps")


def dataset_modalities(cells: list[CellRecord]) -> dict[str, str]:
    """The modality of each dataset's attack rows, as the store records it (by dataset label)."""
    return {str(c.labels.get("dataset")): c.modality for c in cells if c.kind == "attack" and c.modality}


def scenario_label(labels: dict, key: str):
    # rows stored before threat models were recorded carry no 'threat' label
    return labels.get(key, "unrecorded") if key == "threat" else labels.get(key)


def cell_ladder(cell: CellRecord) -> dict:
    """The budget ladder an attack cell climbed (gradleak.run.ladder); {} for cells stored
    without one."""
    ladder = cell.extras.get("ladder") if isinstance(cell.extras, dict) else None
    return ladder if isinstance(ladder, dict) else {}


def cell_saturated(cell: CellRecord) -> bool:
    """Whether more budget would not have changed the cell's result, as the auditor judged it."""
    return bool(cell_ladder(cell).get("saturated"))


def cell_training_unconfirmed(cell: CellRecord) -> bool:
    """Whether the cell attacked a captured update that the declared training, replayed on the
    ground truth, did not reproduce (`api.check_declared_training`): its attacks replayed
    another training than the client's."""
    check = cell.extras.get("training_check") if isinstance(cell.extras, dict) else None
    return isinstance(check, dict) and check.get("confirmed") is False


def cell_training_blind(cell: CellRecord) -> str | None:
    """What of the client's training the cell's attack did not model (`Attack.blind_to`)."""
    blind = cell.extras.get("training_blind") if isinstance(cell.extras, dict) else None
    if isinstance(blind, list):
        blind = next((b for b in blind if b), None)
    return blind if isinstance(blind, str) and blind else None


def average(values):
    values = [v for v in values if v is not None]
    return float(mean(values)) if values else None


def interval95(values) -> tuple[float | None, float | None]:
    """Mean and half-width of the 95% Student-t interval of the mean (None with fewer
    than two values: one seed gives no interval)."""
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not values:
        return None, None
    centre = float(mean(values))
    if len(values) < 2:
        return centre, None
    from scipy.stats import t

    return centre, float(t.ppf(0.975, len(values) - 1) * stdev(values) / math.sqrt(len(values)))


def sortable(value):
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))
