"""What one sweep cell computes: an attack run or a utility run, as a picklable,
JSON-shaped result. Executors call `execute_cell`; the driver stores its result."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

from ..run.experiment import AttackRunSpec, jsonable


def utility_spec_type():
    """The utility module's spec dataclass (the annotation of `run_utility`'s
    argument), or None when gradleak.utility is not available."""
    import typing

    try:
        from .. import utility
    except ImportError:
        return None
    run = getattr(utility, "run_utility", None)
    if run is None:
        return None
    hints = typing.get_type_hints(run)
    params = [p for p in hints if p != "return"]
    spec_type = hints.get(params[0]) if params else None
    return spec_type if dataclasses.is_dataclass(spec_type) else None


def execute_cell(kind: str, spec: dict, progress: Callable[[int, int, float], None] | None = None,
                 artifacts: Path | None = None) -> dict:
    """Run one cell and return a picklable, JSON-shaped result (PNG bytes included).
    Deterministic given the spec; `artifacts` is the study's folder for what attacks train
    once and reuse (the learned inverters)."""
    cpu_start = time.process_time()
    result = _execute_utility(spec) if kind == "utility" else _execute_attack(spec, progress, artifacts)
    result["cpu_seconds"] = time.process_time() - cpu_start
    return result


def attack_run_spec(spec: dict) -> AttackRunSpec:
    """A cell's stored (JSON-shaped) attack spec as the AttackRunSpec it was made from."""
    fields = dict(spec)
    for key in ("defenses", "knows", "augment"):
        fields[key] = tuple(fields.get(key) or ())
    if isinstance(spec.get("augment"), str):  # "crop,flip", as on the command line
        fields["augment"] = tuple(a.strip() for a in spec["augment"].split(",") if a.strip())
    return AttackRunSpec(**fields)


def utility_run_spec(spec: dict):
    """A cell's stored utility spec as the utility module's spec dataclass."""
    spec_type = utility_spec_type()
    fields = {}
    for f in dataclasses.fields(spec_type):
        if f.name in spec:
            value = spec[f.name]
            fields[f.name] = tuple(value) if isinstance(value, list) else value
    return spec_type(**fields)


def _execute_attack(spec: dict, progress, artifacts: Path | None) -> dict:
    from ..run.experiment import result_record, run_attack

    run_spec = attack_run_spec(spec)
    return result_record(run_attack(run_spec, progress, artifacts))


def _execute_utility(spec: dict) -> dict:
    from .. import utility

    start = time.perf_counter()
    result = utility.run_utility(utility_run_spec(spec))
    seconds = time.perf_counter() - start
    if hasattr(result, "to_json"):
        data = result.to_json()
    elif dataclasses.is_dataclass(result):
        data = dataclasses.asdict(result)
    else:
        data = dict(result)
    data = jsonable(data)
    # Results only: timing and echoed settings (rounds, δ) would break "same spec → same metrics".
    not_metrics = {"seconds", "rounds", "delta"}
    metrics = {k: v for k, v in data.items()
               if k not in not_metrics and (v is None or isinstance(v, (int, float))) and not isinstance(v, bool)}
    if isinstance(data.get("metrics"), dict):
        metrics.update({k: v for k, v in data["metrics"].items() if isinstance(v, (int, float, type(None)))})
    extras = {k: v for k, v in data.items() if k not in metrics and k not in not_metrics and k != "spec"}
    return {"metrics": metrics, "extras": extras,
            "seconds": seconds, "grid_png": None, "images": [], "modality": getattr(result, "modality", None)}
