"""Running a sweep: the driver hands the unfinished cells to an executor and
writes every result (or failure) to the store as it arrives."""
from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GradleakError
from .executors import CellFailure, InProcessExecutor, ProcessExecutor
from .progress import sweep_progress
from .spec import Cell, Sweep, cell_key, setting_key

if TYPE_CHECKING:
    from ..store import CellRecord


def study_artifacts(store) -> Path | None:
    """The folder beside a results store where attacks keep what they train once per setting
    (content-addressed, so stores in one folder share it); None for a store without a file."""
    path = getattr(store, "path", None)
    return Path(path).parent / "artifacts" if path is not None else None


def make_executor(name: str, workers: int, address: str | None = None, artifacts: Path | None = None):
    """`artifacts`: the study's folder for what attacks train once and reuse across cells."""
    if name == "local":
        return InProcessExecutor(artifacts) if workers == 1 else ProcessExecutor(workers, artifacts)
    if name == "ray":
        from .ray_executor import RayExecutor  # lazy: Ray is imported only when asked for

        return RayExecutor(address, workers, artifacts=artifacts)
    raise GradleakError(f"--executor must be local or ray, got '{name}'")


def store_result(store, sweep_name: str, cell: Cell, result: dict) -> bool:
    return store_result_record(store, sweep_name, cell.kind, cell.spec, cell.labels, result, cell.key)


def store_result_record(store, sweep_name: str, kind: str, spec: dict, labels: dict, result: dict,
                        key: str | None = None, modality: str | None = None) -> bool:
    """Write one result (as `experiment.result_record` shapes it) as a store row. Its modality
    is the attacked data's as declared when it was loaded: `modality`, else the result's own
    `modality` entry (None where the writer knows none)."""
    from ..store import CellRecord, ImageRecord

    record = CellRecord(key or cell_key(kind, spec), kind, sweep_name, spec, labels, result["metrics"],
                        result["extras"], result["seconds"], result["grid_png"], result.get("cpu_seconds"),
                        modality if modality is not None else result.get("modality"))
    images = [ImageRecord(im["idx"], im["metrics"], im["original"], im["reconstruction"])
              for im in result["images"]]
    return store.add_cell(record, images)


def store_failure(store, sweep_name: str, cell: Cell, error: str) -> bool:
    """Record a cell that raised, as kind 'failed' with its one-line error; the next run of
    the sweep tries it again and replaces the row when it succeeds."""
    from ..store import CellRecord

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
    from ..attacks import make_attack

    attack = make_attack(spec["attack"])
    options = attack.options
    iterations = getattr(options, "iterations", 1) * getattr(options, "restarts", 1)
    # An L-BFGS iteration evaluates the objective up to ~20 times (DLG always uses it).
    if getattr(options, "optimizer", "lbfgs" if attack.name == "dlg" else "adam") == "lbfgs":
        iterations *= 20
    steps = spec.get("local_steps") or 1
    return iterations * steps * (1 + spec["batch_size"] / 4)


def _examples(spec: dict) -> int:
    return int(spec.get("images") or spec.get("batch_size") or 1)


def measured_costs(stored: Iterable[CellRecord], cells: list[Cell]) -> dict[str, float] | None:
    """Each cell's expected seconds from the `stored` cells of its setting (their mean seconds per
    example, times its examples), when every one of `cells` has such cells stored (a ladder's
    rung: more seeds or examples of settings already run); else None, and the heuristic
    `estimated_cost` orders them. What the heuristic cannot price, measured times know: e.g. a
    utility run under a defense that trains per example (DP-SGD) takes several undefended ones."""
    per_example: dict[str, list[float]] = {}
    for record in stored:
        if record.seconds > 0:  # a failure is stored with 0
            per_example.setdefault(setting_key(record.kind, record.spec, ("seed", "images")), []).append(
                record.seconds / _examples(record.spec))
    costs = {}
    for cell in cells:
        seen = per_example.get(setting_key(cell.kind, cell.spec, ("seed", "images")))
        if not seen:
            return None
        costs[cell.key] = _examples(cell.spec) * sum(seen) / len(seen)
    return costs


def is_utility_baseline(cell: Cell) -> bool:
    """The undefended utility run of a (dataset, model, seed): the reference every
    defense's utility loss is measured from."""
    return cell.kind == "utility" and not cell.spec.get("defenses")


def untrained_baseline(sweep_name: str, cell: Cell, metrics: dict) -> str | None:
    """One line refusing the sweep when the undefended utility run did not train, else None:
    its test accuracy is not clearly above chance (`gradleak.utility.near_chance`), or, for a
    language model, its test loss not clearly under a uniform guess's
    (`gradleak.utility.near_uniform`) — the rules by which the analysis calls a utility model
    untrained. Such a baseline makes every defense look free (utility loss 0), typically
    because utility.options names no model and FedAvg trained the attacked architecture (the
    sigmoid LeNet stays at chance)."""
    from ..utility import DEFAULT_MODEL, NEAR_CHANCE, NEAR_UNIFORM_NATS, near_chance, near_uniform

    accuracy, classes = metrics.get("test_accuracy"), metrics.get("num_classes")
    loss = metrics.get("test_loss")
    if not isinstance(classes, (int, float)) or classes < 2:
        return None  # a result without them (an older utility module) cannot be judged
    classes = int(round(classes))
    if metrics.get("next_token"):
        if not isinstance(loss, (int, float)) or not near_uniform(float(loss), classes):
            return None
        uniform = math.log(classes)
        reached = (f"to test loss {float(loss):.3g} (a uniform guess over its {classes} tokens: "
                   f"{uniform:.3g}; one that trained is under {uniform - NEAR_UNIFORM_NATS:.3g})")
    else:
        if not isinstance(accuracy, (int, float)) or not near_chance(float(accuracy), classes):
            return None
        chance = 1.0 / classes
        reached = (f"to test accuracy {float(accuracy):.3g} (chance {chance:.3g}; one that trained clears "
                   f"{chance + NEAR_CHANCE:.3g})")
    fix = ("give it more rounds or a larger lr in utility.options" if metrics.get("next_token") else
           f"name a model that trains in utility.options (e.g. model: \"{DEFAULT_MODEL}\") or give it more rounds")
    labels = cell.labels
    trained = cell.spec.get("model") or labels.get("trained_model") or labels.get("model")
    named = trained != labels.get("model")
    what = (f"utility.options.model '{trained}'" if named
            else f"the attacked model '{trained}' (utility.options names no model)")
    return (f"sweep '{sweep_name}': the undefended utility run did not train: FedAvg trained {what} on "
            f"{labels.get('dataset', cell.spec.get('dataset'))} (seed {cell.spec.get('seed')}) {reached}, "
            f"so every defense would show no utility loss; {fix}; the sweep stopped, the cells that "
            f"finished are stored")


def run_sweep(sweep: Sweep, store, workers: int | None = None, executor: str = "local",
              address: str | None = None, show_progress: bool = True) -> dict:
    """Run every cell of `sweep` not yet in `store`; the driver writes each result
    as it arrives. Returns counts and timing.

    The undefended utility runs go first: when one did not train (test accuracy near
    chance, see `untrained_baseline`) the sweep stops with a GradleakError (one line,
    exit code 2) instead of spending its time on attack cells whose utility losses would
    all read 0; what finished is stored. A stored baseline that did not train stops the
    sweep before anything runs."""
    done = store.finished_keys()
    todo = [c for c in sweep.cells if c.key not in done]
    if workers is not None and workers < 1:
        raise GradleakError(f"--workers must be >= 1, got {workers}")
    baselines = {c.key: c for c in sweep.cells if is_utility_baseline(c)}
    if done & baselines.keys():
        for record in store.cells("utility"):
            if record.key in baselines:
                refusal = untrained_baseline(sweep.name, baselines[record.key], record.metrics)
                if refusal:
                    raise GradleakError(refusal)
    workers = workers or default_workers()
    start = time.perf_counter()
    totals = {"written": 0, "cpu_seconds": 0.0, "failed": []}
    _run_cells(sweep, store, todo, baselines, workers, executor, address, show_progress, totals,
               total=len(sweep.cells), already=len(sweep.cells) - len(todo))
    extra = run_sample_ladder(sweep, store, workers, executor, address, show_progress, totals)
    seeds = run_utility_ladder(sweep, store, workers, executor, address, show_progress, totals)
    seconds = time.perf_counter() - start
    written, failed = totals["written"], totals["failed"]
    return {"sweep": sweep.name, "cells": len(sweep.cells) + extra["cells"] + seeds["cells"],
            "skipped": len(sweep.cells) - len(todo) + extra["skipped"] + seeds["skipped"],
            "ran": written, "failed": failed, "seconds": round(seconds, 3),
            "cpu_seconds": round(totals["cpu_seconds"], 3), "sample_cells": extra["cells"],
            "sample_rungs": extra["rungs"], "utility_seed_cells": seeds["cells"], "utility_rungs": seeds["rungs"],
            "workers": workers, "executor": executor,
            "cells_per_minute": round(60 * written / seconds, 3) if written and seconds > 0 else None}


def _run_cells(sweep: Sweep, store, todo: list[Cell], baselines: dict, workers: int, executor: str,
               address: str | None, show_progress: bool, totals: dict, total: int, already: int,
               stored: list[CellRecord] | None = None) -> None:
    """Run `todo` on the executor, writing each result (or failure) to the store as it arrives.
    `stored`: the store's cells when the caller has just read them (they price `todo`)."""
    if not todo:
        return
    if workers > 1:
        measured = measured_costs(store.cells() if stored is None else stored, todo)
        todo.sort(key=(lambda c: measured[c.key]) if measured else estimated_cost, reverse=True)
    todo.sort(key=lambda c: c.key not in baselines)  # stable: baselines first, the rest as ordered
    refusal = None
    with sweep_progress(total, already, enabled=show_progress) as bars:
        runner = make_executor(executor, workers, address, study_artifacts(store))
        # closing: stopping early stops the executor's running cells at once
        with closing(runner.run(todo, bars)) as results:
            for cell, result in results:
                if isinstance(result, CellFailure):
                    store_failure(store, sweep.name, cell, result.error)
                    totals["failed"].append({"key": cell.key, "cell": cell_title(cell), "error": result.error})
                else:
                    totals["written"] += store_result(store, sweep.name, cell, result)
                    totals["cpu_seconds"] += result.get("cpu_seconds") or 0.0
                    if cell.key in baselines:
                        refusal = untrained_baseline(sweep.name, cell, result["metrics"])
                bars.cell_done(cell)
                if refusal:
                    break
    if refusal:
        raise GradleakError(refusal)


def run_sample_ladder(sweep: Sweep, store, workers: int, executor: str, address: str | None,
                      show_progress: bool, totals: dict) -> dict:
    """Add examples to the settings whose verdict is still open (gradleak.sweep.samples), one
    rung at a time, each rung judged on everything stored so far. Returns the cells it planned,
    those already stored, and the rungs it ran."""
    from ..analysis import strongest_attacks
    from .samples import examples_judged, extension_cells, saturated_budgets

    planned = skipped = rungs = 0
    for rung in range(1, sweep.samples.rungs + 1):
        cells = [c for c in store.cells() if c.sweep == sweep.name]
        extension = extension_cells(sweep.cells, strongest_attacks(cells, sweep.tolerance), examples_judged(cells),
                                    rung, sweep.samples, saturated_budgets(cells))
        if not extension:
            break
        done = store.finished_keys()
        todo = [c for c in extension if c.key not in done]
        planned, skipped, rungs = planned + len(extension), skipped + len(extension) - len(todo), rung
        _run_cells(sweep, store, todo, {}, workers, executor, address, show_progress, totals,
                   total=len(extension), already=len(extension) - len(todo), stored=cells)
    return {"cells": planned, "skipped": skipped, "rungs": rungs}


# Rounds of utility seeds at most: each plans, from the spread so far, all the seeds it needs.
UTILITY_LADDER_RUNGS = 3


def run_utility_ladder(sweep: Sweep, store, workers: int, executor: str, address: str | None,
                       show_progress: bool, totals: dict) -> dict:
    """Add utility seeds to the defenses whose utility loss is not yet told within the study's
    precision (gradleak.sweep.utility_ladder), a rung at a time, each planned on everything
    stored so far. Returns the cells it planned, those already stored, and the rungs it ran."""
    from ..analysis import answer, strongest_attacks, study_utility_budget
    from ..analysis.costs import utility_key
    from .utility_ladder import utility_extension

    planned = skipped = rungs = 0
    for rung in range(1, UTILITY_LADDER_RUNGS + 1):
        cells = [c for c in store.cells() if c.sweep == sweep.name]
        stored = [c for c in cells if c.kind == "utility"]
        budget = study_utility_budget(cells)
        named = {utility_key(e) for a in answer(strongest_attacks(cells, sweep.tolerance)) for e in a.get("named", [])}
        extension = utility_extension(sweep.cells, stored, sweep.utility_ladder, budget, named)
        if not extension:
            break
        done = store.finished_keys()
        todo = [c for c in extension if c.key not in done]
        if not todo:
            break  # planned and stored already: a resumed sweep whose failed cells stay failed
        planned, skipped, rungs = planned + len(extension), skipped + len(extension) - len(todo), rung
        _run_cells(sweep, store, todo, {}, workers, executor, address, show_progress, totals,
                   total=len(extension), already=len(extension) - len(todo), stored=cells)
    return {"cells": planned, "skipped": skipped, "rungs": rungs}
