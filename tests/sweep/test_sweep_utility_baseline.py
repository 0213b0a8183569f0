"""A sweep whose undefended utility run did not train (test accuracy near chance) stops with one
line, before the attack cells, instead of reporting every defense as free; a model that trains
passes. The sigmoid MLP on digits stays at chance (0.100) under these FedAvg settings, the ReLU
MLP reaches 0.55."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradleak import analysis, utility
from gradleak.errors import GradleakError
from gradleak.store import ResultStore
from gradleak.sweep import parse_sweep, run_sweep

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
OPTIONS = "clients: 4, per_round: 4, rounds: 10, local_steps: 5"


def _spec(utility_model: str | None = None, attacked: str = "mlp:activation=sigmoid") -> str:
    model = f", model: \"{utility_model}\"" if utility_model else ""
    return f"""
name: baseline
defaults: {{lpips: none}}
grids:
  - datasets: [digits]
    models: ["{attacked}"]
    batch_sizes: [1, 2]
    seeds: [0]
    defenses: [none, "noise:sigma=0.01"]
    attacks: [fc-analytic]
utility:
  options: {{{OPTIONS}{model}}}
"""


def test_the_refusal_and_the_analysis_share_one_rule():
    assert utility.NEAR_CHANCE == analysis.NEAR_CHANCE
    assert utility.near_chance(0.2, 10) and not utility.near_chance(0.21, 10)
    assert analysis.did_not_train({"test_accuracy": 0.2, "num_classes": 10}, "test_accuracy")
    assert not analysis.did_not_train({"test_accuracy": 0.21, "num_classes": 10}, "test_accuracy")


def test_a_language_model_is_judged_by_its_loss_against_a_uniform_guess():
    """Next-token accuracy is no guide (a model that learned the frequent tokens scores about 5%
    on news, under chance + 0.1); its test loss against log(vocabulary) is, by the same rule in
    the sweep's refusal and in the analysis."""
    from types import SimpleNamespace

    from gradleak.sweep.run import untrained_baseline

    vocabulary = 50257
    uniform = math.log(vocabulary)
    assert utility.NEAR_UNIFORM_NATS == analysis.NEAR_UNIFORM_NATS == 1.0
    assert utility.near_uniform(uniform - 0.99, vocabulary) and not utility.near_uniform(uniform - 1.01, vocabulary)
    assert utility.near_uniform(float("nan"), vocabulary)
    cell = SimpleNamespace(labels={"dataset": "news", "model": "gpt2"}, spec={"seed": 0})
    for loss, refused in ((uniform - 0.99, True), (uniform - 1.01, False)):
        metrics = {"test_accuracy": 0.05, "test_loss": loss, "num_classes": vocabulary, "next_token": True}
        assert bool(analysis.did_not_train(metrics, "test_loss")) is refused
        assert bool(untrained_baseline("text", cell, metrics)) is refused
    message = untrained_baseline("text", cell, {"test_accuracy": 0.05, "test_loss": 10.5, "num_classes": vocabulary,
                                                "next_token": True})
    assert "to test loss 10.5 (a uniform guess over its 50257 tokens: 10.8; one that trained is under 9.82)" in message
    assert "give it more rounds or a larger lr" in message and "\n" not in message
    # the analysis measures a language model's utility loss in test loss (lower is better)
    table = {("news", "gpt2", "none", ""): {"next_token": 1.0, "test_accuracy": 0.05, "test_loss": 9.4}}
    assert analysis.utility_metric(table) == ("test_loss", False)


def test_untrained_baseline_stops_the_sweep_before_the_attack_cells(tmp_path):
    sweep = parse_sweep(_spec())
    assert len(sweep.attack_cells) == 4 and len(sweep.utility_cells) == 2
    with ResultStore(tmp_path / "store.db") as store:
        with pytest.raises(GradleakError) as refused:
            run_sweep(sweep, store, workers=1, show_progress=False)
        message = str(refused.value)
        # what finished stays stored: the undefended utility run, which ran first, and nothing else
        stored = store.cells()
        assert [(c.kind, c.labels["defense"]) for c in stored] == [("utility", "none")]
        assert stored[0].metrics["test_accuracy"] <= 0.2 and stored[0].metrics["num_classes"] == 10
        # the store already says so: a second run refuses before running anything
        with pytest.raises(GradleakError) as again:
            run_sweep(sweep, store, workers=1, show_progress=False)
        assert str(again.value) == message and len(store.cells()) == 1
    assert "\n" not in message
    assert message.startswith("sweep 'baseline': the undefended utility run did not train: FedAvg trained "
                              "the attacked model 'mlp:activation=sigmoid' (utility.options names no model) "
                              "on digits (seed 0) to test accuracy 0.1")
    assert "(chance 0.1; one that trained clears 0.2)" in message
    assert "name a model that trains in utility.options" in message
    assert f'model: "{utility.DEFAULT_MODEL}"' in message


def test_untrained_utility_model_named_in_the_options_is_refused_by_its_name(tmp_path):
    sweep = parse_sweep(_spec("mlp:activation=sigmoid", attacked="mlp"))
    with ResultStore(tmp_path / "store.db") as store, pytest.raises(
            GradleakError, match=r"FedAvg trained utility.options.model 'mlp:activation=sigmoid' on digits"):
        run_sweep(sweep, store, workers=1, show_progress=False)


def test_a_utility_model_that_trains_passes_and_every_cell_runs(tmp_path):
    sweep = parse_sweep(_spec("mlp"))
    with ResultStore(tmp_path / "store.db") as store:
        summary = run_sweep(sweep, store, workers=1, show_progress=False)
        # the six grid cells, and whatever the sample ladder added where the verdict was open
        assert summary["ran"] == summary["cells"] == 6 + summary["sample_cells"] and not summary["failed"]
        baseline = next(c for c in store.cells("utility") if c.labels["defense"] == "none")
        assert baseline.labels["trained_model"] == "mlp" and baseline.metrics["test_accuracy"] > 0.5
        # stored and trained: a second run has nothing to do and nothing to refuse
        assert run_sweep(sweep, store, workers=1, show_progress=False)["ran"] == 0


def test_cli_refusal_is_one_line_exit_2_with_worker_processes(tmp_path):
    (tmp_path / "sweep.yaml").write_text(_spec())
    store = tmp_path / "store.db"
    proc = subprocess.run([sys.executable, "-m", "gradleak", "sweep", str(tmp_path / "sweep.yaml"), "--store",
                           str(store), "--workers", "2", "--json"], env=ENV, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "the undefended utility run did not train" in lines[0]
    with ResultStore(store) as db:  # the baseline is stored; any attack cell that finished beside it is whole
        cells = db.cells()
        assert ("utility", "none") in [(c.kind, c.labels["defense"]) for c in cells]
        for cell in cells:
            if cell.kind == "attack":
                assert len(db.images(cell.key)) == cell.spec["batch_size"]
