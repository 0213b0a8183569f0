"""Sweeps: a YAML grid of scenarios, expanded into cells, run in parallel, stored.

Spec (every key optional except `grids`):

    name: demo
    defaults: {lr: 0.1, lpips: alex}        # any AttackRunSpec field, for every cell
    grids:                                   # each grid is a cartesian product
      - datasets: [mnist]
        models: [lenet]
        batch_sizes: [1, 4]
        local_steps: [1]
        seeds: [0]
        defenses:                            # none | "name:k=v" | [chain...] | {name, options}
          - none
          - {name: noise, options: {sigma: [0.001, 0.01]}}   # lists expand: one cell each
        attacks:
          - ig:iterations=300
          - {name: dlg, options: {iterations: [100, 300]}}
          - {name: rtf, threat: malicious}     # per-attack threat / knows
    utility:                                 # optional: one FedAvg utility run per
      options: {rounds: 15}                  # (dataset, model, defenses) of the grids, plus
      seeds: [0]                             # the undefended baseline (UtilitySpec fields)

Every cell is an `AttackRunSpec` (or a utility spec), keyed by a hash of its
full spec; see gradleak.store.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import GradleakError
from .experiment import AttackRunSpec, jsonable
from .options import parse_spec

CELL_VERSION = 2  # bump when a cell's result would change for the same spec

_GRID_AXES = {"datasets": "dataset", "models": "model", "batch_sizes": "batch_size",
              "local_steps": "local_steps", "seeds": "seed"}
_GRID_KEYS = set(_GRID_AXES) | {"defenses", "attacks", "defaults"}
_TOP_KEYS = {"name", "description", "defaults", "grids", "utility"}
_UTILITY_KEYS = {"options", "seeds"}
_ATTACK_RUN_KEYS = {"threat", "knows"}


@dataclass(frozen=True)
class Cell:
    kind: str  # "attack" | "utility"
    spec: dict  # AttackRunSpec.to_dict() or the utility spec's fields
    labels: dict  # dataset, model, batch_size, local_steps, seed, defense, strength, attack, ...
    key: str = ""

    def __post_init__(self):
        if not self.key:
            object.__setattr__(self, "key", cell_key(self.kind, self.spec))


@dataclass
class Sweep:
    name: str
    cells: list[Cell]
    source: str = ""

    @property
    def attack_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "attack"]

    @property
    def utility_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "utility"]


def cell_key(kind: str, spec: dict) -> str:
    text = json.dumps({"kind": kind, "spec": spec, "version": CELL_VERSION}, sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --------------------------------------------------------------------------- parsing

def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    if not path.is_file():
        raise GradleakError(f"sweep spec '{path}' not found")
    return parse_sweep(path.read_text(), str(path))


def parse_sweep(text: str, source: str = "<sweep>") -> Sweep:
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise GradleakError(f"sweep '{source}':{where} invalid YAML ({getattr(exc, 'problem', exc)})") from None
    return _SweepParser(source).parse(doc)


class _SweepParser:
    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, message: str):
        raise GradleakError(f"sweep '{self.source}': {where}: {message}")

    def mapping(self, value, where) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {type(value).__name__}")
        return value

    def listing(self, value, where) -> list:
        if value is None:
            self.fail(where, "must not be empty")
        items = value if isinstance(value, list) else [value]
        if not items:
            self.fail(where, "must not be empty")
        return items

    def check_keys(self, doc: dict, allowed: set[str], where: str) -> None:
        for key in doc:
            if key not in allowed:
                self.fail(f"{where}{key}" if where else str(key),
                          f"unknown field; valid: {', '.join(sorted(allowed))}")

    def parse(self, doc) -> Sweep:
        if doc is None:
            raise GradleakError(f"sweep '{self.source}': the file is empty")
        doc = self.mapping(doc, "top level")
        self.check_keys(doc, _TOP_KEYS, "")
        if "grids" not in doc:
            self.fail("grids", "missing (a list of grids)")
        name = str(doc.get("name") or Path(self.source).stem)
        defaults = self.run_fields(self.mapping(doc.get("defaults") or {}, "defaults"), "defaults")
        cells: dict[str, Cell] = {}
        for gi, grid in enumerate(self.listing(doc["grids"], "grids")):
            for cell in self.grid(grid, f"grids[{gi}]", defaults):
                cells.setdefault(cell.key, cell)
        if "utility" in doc and doc["utility"] is not None:
            for cell in self.utility(doc["utility"], list(cells.values())):
                cells.setdefault(cell.key, cell)
        return Sweep(name, list(cells.values()), self.source)

    def run_fields(self, values: dict, where: str) -> dict:
        names = {f.name for f in dataclasses.fields(AttackRunSpec)}
        for key in values:
            if key not in names:
                self.fail(f"{where}.{key}", f"not an AttackRunSpec field; valid: {', '.join(sorted(names))}")
        return dict(values)

    def grid(self, grid, where: str, defaults: dict) -> list[Cell]:
        grid = self.mapping(grid, where)
        self.check_keys(grid, _GRID_KEYS, f"{where}.")
        base = dict(defaults)
        base.update(self.run_fields(self.mapping(grid.get("defaults") or {}, f"{where}.defaults"),
                                    f"{where}.defaults"))
        axes: dict[str, list] = {}
        for axis, fieldname in _GRID_AXES.items():
            if axis in grid:
                values = self.listing(grid[axis], f"{where}.{axis}")
                for i, v in enumerate(values):
                    self.axis_value(fieldname, v, f"{where}.{axis}[{i}]")
                axes[fieldname] = values
            elif fieldname not in base and fieldname in ("dataset", "model"):
                self.fail(f"{where}.{axis}", "missing (and no default)")
        if "attacks" not in grid:
            self.fail(f"{where}.attacks", "missing")
        attacks = self.attacks(grid["attacks"], f"{where}.attacks")
        defenses = self.defense_chains(grid.get("defenses", ["none"]), f"{where}.defenses")
        cells = []
        names = list(axes)
        for combo in itertools.product(*(axes[n] for n in names)):
            fields = dict(base)
            fields.update(zip(names, combo))
            for chain in defenses:
                for attack, overrides in attacks:
                    spec = self.build_spec({**fields, **overrides, "attack": attack, "defenses": tuple(chain)},
                                           where)
                    cells.append(Cell("attack", _canonical(spec.to_dict()), attack_labels(spec)))
        return cells

    def axis_value(self, fieldname: str, value, where: str) -> None:
        if fieldname in ("dataset", "model"):
            if not isinstance(value, str) or not value.strip():
                self.fail(where, f"must be a {fieldname} name, got {value!r}")
            if fieldname == "model" and _is_user_model(value):
                return
            if fieldname == "dataset" and _dataset_path(value):
                return
            registry = _registry(fieldname)
            name = parse_spec(value, fieldname).name
            if name not in registry:
                self.fail(where, f"unknown {fieldname} '{name}'; choose from: {', '.join(registry.names())}")
        else:
            minimum = 0 if fieldname == "seed" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                self.fail(where, f"must be an integer >= {minimum}, got {value!r}")

    def attacks(self, items, where: str) -> list[tuple[str, dict]]:
        """Attack entries → (`name:k=v`, per-attack AttackRunSpec fields such as
        `threat: malicious` for a malicious-server attack)."""
        out = []
        for i, item in enumerate(self.listing(items, where)):
            at = f"{where}[{i}]"
            overrides = {}
            if isinstance(item, dict):
                overrides = {k: v for k, v in item.items() if k in _ATTACK_RUN_KEYS}
                item = {k: v for k, v in item.items() if k not in _ATTACK_RUN_KEYS}
            out += [(text, overrides) for text in self.component(item, at, "attack", _ATTACK_RUN_KEYS)]
        return out

    def component(self, item, where: str, kind: str, extra_keys: set[str] = frozenset()) -> list[str]:
        """One entry → one or more `name:k=v` strings (list-valued options expand)."""
        if isinstance(item, str):
            texts = [item]
        elif isinstance(item, dict):
            self.check_keys(item, {"name", "options", *extra_keys}, f"{where}.")
            if not isinstance(item.get("name"), str):
                self.fail(f"{where}.name", f"missing {kind} name")
            options = self.mapping(item.get("options") or {}, f"{where}.options")
            keys = list(options)
            value_lists = [options[k] if isinstance(options[k], list) else [options[k]] for k in keys]
            for k, vs in zip(keys, value_lists):
                if not vs:
                    self.fail(f"{where}.options.{k}", "empty list")
            texts = [item["name"] + (":" + ",".join(f"{k}={_fmt(v)}" for k, v in zip(keys, combo)) if keys else "")
                     for combo in itertools.product(*value_lists)]
        else:
            self.fail(where, f"expected '{kind}:key=value' or {{name, options}}, got {item!r}")
        for text in texts:
            self.validate_component(text, where, kind)
        return [str(parse_spec(t, kind)) for t in texts]

    def validate_component(self, text: str, where: str, kind: str) -> None:
        try:
            if kind == "attack":
                from .attacks import make_attack
                make_attack(text)
            else:
                from .defenses import make_defense
                make_defense(text)
        except GradleakError as exc:
            self.fail(where, str(exc))

    def defense_chains(self, items, where: str) -> list[tuple[str, ...]]:
        chains: list[tuple[str, ...]] = []
        for i, item in enumerate(self.listing(items, where)):
            at = f"{where}[{i}]"
            if item is None or (isinstance(item, str) and item.strip().lower() == "none"):
                chains.append(())
            elif isinstance(item, list):
                parts = [self.component(p, f"{at}[{j}]", "defense") for j, p in enumerate(item)]
                chains += [tuple(c) for c in itertools.product(*parts)]
            else:
                chains += [(d,) for d in self.component(item, at, "defense")]
        return chains

    def build_spec(self, fields: dict, where: str) -> AttackRunSpec:
        fields = dict(fields)
        for key in ("defenses", "knows"):
            if key in fields and isinstance(fields[key], (list, str)):
                value = fields[key]
                fields[key] = tuple([value] if isinstance(value, str) else value)
        try:
            return AttackRunSpec(**fields)
        except GradleakError as exc:
            self.fail(where, str(exc))
        except TypeError as exc:
            self.fail(where, str(exc))

    def utility(self, doc, cells: list[Cell]) -> list[Cell]:
        doc = self.mapping(doc, "utility")
        self.check_keys(doc, _UTILITY_KEYS, "utility.")
        spec_type = utility_spec_type()
        if spec_type is None:
            self.fail("utility", "utility runs need gradleak.utility (run_utility), which is not installed")
        options = self.mapping(doc.get("options") or {}, "utility.options")
        valid = {f.name for f in dataclasses.fields(spec_type)}
        for key in options:
            if key not in valid:
                self.fail(f"utility.options.{key}", f"not a {spec_type.__name__} field; valid: {', '.join(sorted(valid))}")
        seeds = self.listing(doc.get("seeds", [0]), "utility.seeds")
        for i, s in enumerate(seeds):
            self.axis_value("seed", s, f"utility.seeds[{i}]")
        # One utility run per (dataset, model, defenses) of the grids plus the undefended
        # baseline; FedAvg training itself (rounds, local steps, ...) comes from `options`,
        # the same for every run, so utility losses are comparable.
        scenarios = []
        for c in cells:
            s = c.spec
            scenarios.append((s["dataset"], s["model"], tuple(s["defenses"])))
            scenarios.append((s["dataset"], s["model"], ()))
        out = []
        for dataset, model, defenses in dict.fromkeys(scenarios):
            for seed in seeds:
                fields = {"dataset": dataset, "model": model, "defenses": defenses, "seed": seed}
                fields = {k: v for k, v in fields.items() if k in valid}
                fields.update(options)
                try:
                    spec = spec_type(**fields)
                except (GradleakError, TypeError, ValueError) as exc:
                    self.fail("utility.options", str(exc))
                spec_dict = _canonical(dataclasses.asdict(spec))
                # `model` is the attacked architecture the utility is reported against;
                # `trained_model` what FedAvg trained, when utility.options names another one.
                labels = {"dataset": dataset_label(dataset), "model": model,
                          "trained_model": spec_dict.get("model", model),
                          "defense": defense_label(defenses), "strength": strength_label(defenses),
                          "defenses": list(defenses), "seed": seed}
                out.append(Cell("utility", spec_dict, labels))
        return out


def _is_user_model(text: str) -> bool:
    from .models.user import is_user_model_ref

    return is_user_model_ref(text)


def _dataset_path(text: str) -> bool:
    from .experiment import dataset_path_form

    return dataset_path_form(text) is not None


def _registry(kind: str):
    if kind == "dataset":
        from .data import DATASETS
        return DATASETS
    from .models import MODELS
    return MODELS


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ";".join(map(_fmt, value))
    return str(value)


def _canonical(value):
    """JSON-shaped copy (tuples → lists) so the hash is stable across processes."""
    return json.loads(json.dumps(value, default=list))


def defense_label(defenses) -> str:
    return "+".join(parse_spec(d, "defense").name for d in defenses) or "none"


def strength_label(defenses) -> str:
    parts = []
    for d in defenses:
        spec = parse_spec(d, "defense")
        parts += [f"{k}={v}" for k, v in spec.options.items()]
    return ",".join(parts) or "default" if defenses else ""


def dataset_label(text: str) -> str:
    """A dataset's name for tables: the registry name, or the path as given."""
    return text.strip() if _dataset_path(text) else parse_spec(text, "dataset").name


def attack_labels(spec: AttackRunSpec) -> dict:
    from .threat import make_threat_model

    attack = parse_spec(spec.attack, "attack")
    return {"threat": make_threat_model(spec.threat, spec.knows).name,
            "dataset": dataset_label(spec.dataset), "model": spec.model,
            "batch_size": spec.batch_size, "local_steps": spec.local_steps, "seed": spec.seed,
            "defense": defense_label(spec.defenses), "strength": strength_label(spec.defenses),
            "defenses": list(spec.defenses), "attack": attack.name, "attack_spec": str(attack),
            "init": attack.options.get("init")}


# --------------------------------------------------------------------------- utility hook

def utility_spec_type():
    """The utility module's spec dataclass (the annotation of `run_utility`'s
    argument), or None when gradleak.utility is not available."""
    import typing

    try:
        from . import utility
    except ImportError:
        return None
    run = getattr(utility, "run_utility", None)
    if run is None:
        return None
    hints = typing.get_type_hints(run)
    params = [p for p in hints if p != "return"]
    spec_type = hints.get(params[0]) if params else None
    return spec_type if dataclasses.is_dataclass(spec_type) else None


# --------------------------------------------------------------------------- one cell

def execute_cell(kind: str, spec: dict, progress: Callable[[int, int, float], None] | None = None) -> dict:
    """Run one cell and return a picklable, JSON-shaped result (PNG bytes included).
    Deterministic given the spec."""
    cpu_start = time.process_time()
    result = _execute_utility(spec) if kind == "utility" else _execute_attack(spec, progress)
    result["cpu_seconds"] = time.process_time() - cpu_start
    return result


def _execute_attack(spec: dict, progress) -> dict:
    from .experiment import result_record, run_attack

    fields = dict(spec)
    fields["defenses"] = tuple(fields["defenses"])
    fields["knows"] = tuple(fields["knows"])
    return result_record(run_attack(AttackRunSpec(**fields), progress))


def _execute_utility(spec: dict) -> dict:
    from . import utility

    spec_type = utility_spec_type()
    fields = {}
    for f in dataclasses.fields(spec_type):
        if f.name in spec:
            value = spec[f.name]
            fields[f.name] = tuple(value) if isinstance(value, list) else value
    start = time.perf_counter()
    result = utility.run_utility(spec_type(**fields))
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
            "seconds": seconds, "grid_png": None, "images": []}


# --------------------------------------------------------------------------- running

def store_result(store, sweep_name: str, cell: Cell, result: dict) -> bool:
    return store_result_record(store, sweep_name, cell.kind, cell.spec, cell.labels, result, cell.key)


def store_result_record(store, sweep_name: str, kind: str, spec: dict, labels: dict, result: dict,
                        key: str | None = None) -> bool:
    """Write one result (as `experiment.result_record` shapes it) as a store row."""
    from .store import CellRecord, ImageRecord

    record = CellRecord(key or cell_key(kind, spec), kind, sweep_name, spec, labels, result["metrics"],
                        result["extras"], result["seconds"], result["grid_png"], result.get("cpu_seconds"))
    images = [ImageRecord(im["idx"], im["metrics"], im["original"], im["reconstruction"])
              for im in result["images"]]
    return store.add_cell(record, images)


def store_failure(store, sweep_name: str, cell: Cell, error: str) -> bool:
    """Record a cell that raised, as kind 'failed' with its one-line error; the next run of
    the sweep tries it again and replaces the row when it succeeds."""
    from .store import CellRecord

    labels = dict(cell.labels, cell_kind=cell.kind)
    return store.add_cell(CellRecord(cell.key, "failed", sweep_name, cell.spec, labels, {}, {"error": error}, 0.0))


def cell_title(cell: Cell) -> str:
    """A cell in a few words, for messages: what ran, under which defenses, at which batch size."""
    labels = cell.labels
    what = labels.get("attack_spec") or cell.kind
    defenses = ", ".join(labels.get("defenses") or []) or "no defense"
    batch = f", batch {labels['batch_size']}" if labels.get("batch_size") is not None else ""
    return f"{what}, {defenses}{batch}"


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def estimated_cost(cell: Cell) -> float:
    """Rough relative run time of a cell, used only to start the longest cells
    first so parallel workers finish together (longest-processing-time order)."""
    spec = cell.spec
    if cell.kind == "utility":
        return 1.5 * spec["rounds"] * spec["per_round"] * (spec.get("local_steps") or 10)
    from .attacks import make_attack

    attack = make_attack(spec["attack"])
    options = attack.options
    iterations = getattr(options, "iterations", 1) * getattr(options, "restarts", 1)
    # An L-BFGS iteration evaluates the objective up to ~20 times (DLG always uses it).
    if getattr(options, "optimizer", "lbfgs" if attack.name == "dlg" else "adam") == "lbfgs":
        iterations *= 20
    steps = spec.get("local_steps") or 1
    return iterations * steps * (1 + spec["batch_size"] / 4)


def run_sweep(sweep: Sweep, store, workers: int | None = None, executor: str = "local",
              address: str | None = None, show_progress: bool = True) -> dict:
    """Run every cell of `sweep` not yet in `store`; the driver writes each result
    as it arrives. Returns counts and timing."""
    from .executors import CellFailure, make_executor, sweep_progress

    done = store.finished_keys()
    todo = [c for c in sweep.cells if c.key not in done]
    if workers is not None and workers < 1:
        raise GradleakError(f"--workers must be >= 1, got {workers}")
    workers = workers or default_workers()
    if workers > 1:
        todo.sort(key=estimated_cost, reverse=True)
    start = time.perf_counter()
    written, cpu_seconds = 0, 0.0
    failed: list[dict] = []
    with sweep_progress(len(sweep.cells), len(sweep.cells) - len(todo), enabled=show_progress) as bars:
        runner = make_executor(executor, workers, address)
        for cell, result in runner.run(todo, bars):
            if isinstance(result, CellFailure):
                store_failure(store, sweep.name, cell, result.error)
                failed.append({"key": cell.key, "cell": cell_title(cell), "error": result.error})
            else:
                written += store_result(store, sweep.name, cell, result)
                cpu_seconds += result.get("cpu_seconds") or 0.0
            bars.cell_done(cell)
    seconds = time.perf_counter() - start
    return {"sweep": sweep.name, "cells": len(sweep.cells), "skipped": len(sweep.cells) - len(todo),
            "ran": written, "failed": failed, "seconds": round(seconds, 3), "cpu_seconds": round(cpu_seconds, 3),
            "workers": workers, "executor": executor,
            "cells_per_minute": round(60 * written / seconds, 3) if written and seconds > 0 else None}
