"""How a sweep's phases share one executor: workers kept between runs while the executor is
open, and the order a ladder rung's cells start in, priced from the cells already stored."""
from __future__ import annotations

import os
from types import SimpleNamespace

from gradleak.store import CellRecord, ResultStore
from gradleak.sweep.executors import CellFailure, ProcessExecutor
from gradleak.sweep.progress import SweepBars
from gradleak.sweep.run import measured_costs
from gradleak.sweep.spec import Cell


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_open_executor_keeps_its_workers_between_runs_and_stops_them_on_close():
    # cells with no spec fail at once: the runs are about where they run, not what they compute
    cells = [SimpleNamespace(key=str(i), kind="attack", spec={}, labels={}) for i in range(3)]
    with ProcessExecutor(2) as runner:
        first = list(runner.run(cells, SweepBars(None, len(cells), 0)))
        workers = set(runner._kept[0]._processes)
        second = list(runner.run(cells[:1], SweepBars(None, 1, 0)))
        assert set(runner._kept[0]._processes) == workers and len(workers) == 2
    assert runner._kept is None
    assert not any(_alive(pid) for pid in workers)
    assert len(first) == 3 and len(second) == 1
    assert all(isinstance(result, CellFailure) for _, result in first + second)


def test_a_closed_executor_has_workers_of_its_own_per_run():
    cells = [SimpleNamespace(key="0", kind="attack", spec={}, labels={})]
    runner = ProcessExecutor(2)
    assert [isinstance(r, CellFailure) for _, r in runner.run(cells, SweepBars(None, 1, 0))] == [True]
    assert runner._kept is None


def _stored(store: ResultStore, kind: str, spec: dict, seconds: float) -> None:
    cell = Cell(kind, spec, {})
    labels = {"dataset": "mnist", "model": "lenet", "defense": "none", "strength": None, "seed": spec["seed"]}
    if kind == "attack":
        labels |= {"attack": spec["attack"], "attack_spec": spec["attack"], "batch_size": spec["batch_size"],
                   "local_steps": 1}
    store.add_cell(CellRecord(cell.key, kind, "s", spec, labels, {}, {}, seconds))


def test_a_rung_is_priced_from_its_settings_stored_cells(tmp_path):
    with ResultStore(tmp_path / "r.db") as store:
        _stored(store, "utility", {"defenses": [], "seed": 0}, 5.0)
        _stored(store, "utility", {"defenses": [], "seed": 1}, 7.0)
        _stored(store, "utility", {"defenses": ["dpsgd"], "seed": 0}, 15.0)
        _stored(store, "attack", {"attack": "ig", "batch_size": 4, "seed": 0}, 2.0)  # 0.5 s an example
        rung = [Cell("utility", {"defenses": [], "seed": 2}, {}),
                Cell("utility", {"defenses": ["dpsgd"], "seed": 2}, {}),
                Cell("attack", {"attack": "ig", "batch_size": 4, "images": 44, "seed": 1}, {})]
        costs = measured_costs(store, rung)
        assert costs == {rung[0].key: 6.0, rung[1].key: 15.0, rung[2].key: 22.0}
        # one cell of a setting never run: no measured order (the heuristic's instead)
        assert measured_costs(store, rung + [Cell("utility", {"defenses": ["sign"], "seed": 0}, {})]) is None
