"""The order a ladder rung's cells start in: priced from the stored cells of their settings."""
from __future__ import annotations

from gradleak.store import CellRecord, ResultStore
from gradleak.sweep.run import measured_costs
from gradleak.sweep.spec import Cell


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
        costs = measured_costs(store.cells(), rung)
        assert costs == {rung[0].key: 6.0, rung[1].key: 15.0, rung[2].key: 22.0}
        # one cell of a setting never run: no measured order (the heuristic's instead)
        assert measured_costs(store.cells(), rung + [Cell("utility", {"defenses": ["sign"], "seed": 0}, {})]) is None
