"""A sweep is validated whole before its first cell runs: a bad value in the last grid (or the
utility runs) is one line naming where it is, exit code 2, and nothing in the store."""
from __future__ import annotations

import pytest

from gradleak.cli import main

GOOD_GRID = """
  - datasets: [mnist]
    models: [lenet]
    attacks: [dlg:iterations=1]
"""


def _sweep(tmp_path, last_grid_extra: str = "", top_extra: str = "") -> str:
    path = tmp_path / "study.yaml"
    path.write_text(f"name: study\n{top_extra}grids:{GOOD_GRID}{GOOD_GRID}    {last_grid_extra}\n")
    return str(path)


@pytest.mark.parametrize("extra,where,said", [
    ("models: ['lenet:width=-3']", "grids[1]", "model 'lenet' option 'width' must be at least 1"),
    ("models: ['mlp:hidden=abc']", "grids[1]", "option 'hidden': 'abc' is not an integer"),
    ("datasets: ['mnist:resize=100000']", "grids[1]", "resize=100000 is out of range"),
    ("defaults: {checkpoint: missing.safetensors}", "grids[1]", "checkpoint 'missing.safetensors' not found"),
    ("defaults: {activation: swishy}", "grids[1]", "unknown activation 'swishy'"),
    ("defaults: {defenses: 5}", "grids[1].defaults.defenses", "expected 'defense:key=value'"),
    ("defaults: {lpips: 3}", "grids[1]", "lpips must be a text, got 3"),
    ("defaults: {knows: 5}", "grids[1]", "knows must be a list"),
    ("defaults: {attack: ig}", "grids[1].defaults.attack", "attacks are listed in each grid"),
    ("defaults: {pretrain_steps: 5}\n    datasets: [cifar10]", "grids[1]", "ships only sample images"),
    ("attacks: [{name: mkor, threat: honest}]", "grids[1]", "needs malicious_model"),
    ("batch_sizes: [30]\n    datasets: [cifar10]", "grids[1]", "has 20 examples, the scenario needs 30"),
])
def test_a_bad_value_in_the_last_grid_is_refused_before_any_cell_runs(tmp_path, capsys, extra, where, said):
    store = tmp_path / "results.db"
    code = main(["sweep", _sweep(tmp_path, extra), "--store", str(store), "--workers", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradleak: error: sweep '") and "Traceback" not in err
    assert f": {where}" in lines[0] and said in lines[0], lines[0]
    assert not store.exists()  # nothing ran, nothing was stored


def test_a_bad_utility_model_is_refused_before_any_cell_runs(tmp_path, capsys):
    store = tmp_path / "results.db"
    path = _sweep(tmp_path, top_extra="utility: {options: {model: 'lenet:activation=swishy', rounds: 1}}\n")
    code = main(["sweep", path, "--store", str(store), "--workers", "1", "--json"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert ": utility: utility run on mnist/lenet: unknown activation 'swishy'" in err
    assert not store.exists()


def test_the_demo_validates_in_seconds():
    import time

    from gradleak.commands.demo import demo_spec_text
    from gradleak.sweep import parse_sweep

    start = time.perf_counter()
    sweep = parse_sweep(demo_spec_text())
    # 32 attack cells (4 settings × 4 attacks × 2 seeds) and 12 utility runs (4 settings × 3
    # seeds); the sample ladder and the utility ladder add more as they run
    assert len(sweep.cells) == 44
    assert sweep.utility_ladder.precision == 0.01 and sweep.utility_ladder.max_seeds == 6  # ± half the budget
    assert time.perf_counter() - start < 30  # 2.8 s here: datasets load once, seed-free checks run once


@pytest.mark.parametrize("value", ["0", "1.5", "'two points'", "true"])
def test_a_bad_utility_budget_is_one_line(tmp_path, capsys, value):
    store = tmp_path / "results.db"
    path = _sweep(tmp_path, top_extra=f"utility: {{max_loss: {value}, options: {{rounds: 1}}}}\n")
    code = main(["sweep", path, "--store", str(store), "--workers", "1", "--json"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and ": utility.max_loss: must be a number in (0, 1]" in err
    assert not store.exists()


def test_a_utility_budget_is_stored_with_every_cell(tmp_path):
    from gradleak.sweep import load_sweep

    path = _sweep(tmp_path, top_extra="utility: {max_loss: 0.02, options: {rounds: 1}}\n")
    sweep = load_sweep(path)
    assert sweep.cells and all(c.labels["utility_budget"] == 0.02 for c in sweep.cells)
    plain = load_sweep(_sweep(tmp_path))
    assert all("utility_budget" not in c.labels for c in plain.cells)
