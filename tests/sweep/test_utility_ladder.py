"""The paired utility loss and the utility sample ladder (issue 59: utility with power)."""
import pytest

from gradleak.analysis.costs import utility_loss, utility_table
from gradleak.store import CellRecord
from gradleak.sweep.spec import Cell, UtilityLadder, parse_sweep
from gradleak.sweep.utility_ladder import seeds_needed, utility_extension

BASE = {"dataset": "mnist", "model": "lenet"}


def _stored(seed: int, defense: str, strength: str, accuracy: float) -> CellRecord:
    labels = {**BASE, "defense": defense, "strength": strength, "seed": seed}
    return CellRecord(f"u{seed}{defense}{strength}", "utility", "t", {"seed": seed}, labels,
                      {"test_accuracy": accuracy, "num_classes": 10}, {}, 1.0)


def _entry(defense: str, strength: str) -> dict:
    return {**BASE, "defense": defense, "strength": strength}


def test_the_loss_is_paired_seed_by_seed_so_a_spread_shared_by_both_runs_cancels():
    # seeds that differ by 10 points in accuracy, a defense that costs exactly 2 points on each
    accuracies = {0: 0.80, 1: 0.90, 2: 0.85}
    cells = [_stored(s, "none", "", a) for s, a in accuracies.items()]
    cells += [_stored(s, "noise", "sigma=0.1", a - 0.02) for s, a in accuracies.items()]
    table = utility_table(cells)
    loss = utility_loss(_entry("noise", "sigma=0.1"), table, ("test_accuracy", True))
    assert loss["utility_loss"] == pytest.approx(0.02)
    assert loss["utility_loss_ci"] == pytest.approx(0.0, abs=1e-9)  # unpaired it would be ± 0.18
    # the undefended run against itself: 0, exactly
    base = utility_loss(_entry("none", ""), table, ("test_accuracy", True))
    assert base["utility_loss"] == 0.0 and base["utility_loss_ci"] == 0.0


def test_without_seeds_in_common_the_runs_are_compared_as_independent():
    cells = [_stored(s, "none", "", a) for s, a in ((0, 0.80), (1, 0.90))]
    cells += [_stored(s, "noise", "sigma=0.1", a) for s, a in ((2, 0.78), (3, 0.88))]
    loss = utility_loss(_entry("noise", "sigma=0.1"), utility_table(cells), ("test_accuracy", True))
    assert loss["utility_loss"] == pytest.approx(0.02)
    assert loss["utility_loss_ci"] > 0.5  # two seeds each, 10 points apart: nothing told


def test_seeds_needed_follow_the_spread_and_stop_at_the_cap():
    assert seeds_needed([0.01, 0.011, 0.009], 0.01, 8) == 3  # ± 0.0025: precise already
    wide = [0.0, 0.02, 0.04]  # sd 0.02: t·sd/√n ≤ 0.01 needs about 20 seeds
    assert seeds_needed(wide, 0.01, 8) == 8
    assert seeds_needed(wide, 0.01, 100) > 8


def _sweep_cells():
    text = """
name: t
grids:
  - {datasets: [mnist], models: [lenet], batch_sizes: [1], seeds: [0], attacks: [dlg],
     defenses: [none, {name: noise, options: {sigma: [0.1, 0.5]}}]}
utility: {options: {rounds: 1, clients: 2, per_round: 1}, seeds: [0, 1, 2], max_loss: 0.02}
"""
    return parse_sweep(text, "t.yaml")


def test_a_budget_sets_the_precision_to_half_of_it_and_the_yaml_can_override_it():
    assert _sweep_cells().utility_ladder == UtilityLadder(precision=0.01, max_seeds=8)
    explicit = parse_sweep("""
grids: [{datasets: [mnist], models: [lenet], batch_sizes: [1], seeds: [0], attacks: [dlg]}]
utility: {seeds: [0, 1], precision: 0.005, max_seeds: 12}
""", "t.yaml")
    assert explicit.utility_ladder == UtilityLadder(precision=0.005, max_seeds=12)


def test_the_ladder_adds_seeds_to_the_imprecise_defense_and_the_baseline_runs_they_pair_with():
    sweep = _sweep_cells()
    labels_of = {(c.labels["strength"]): c for c in sweep.cells if c.kind == "utility" and c.labels["seed"] == 0}
    base = {0: 0.80, 1: 0.90, 2: 0.85}
    stored = [_stored(s, "none", "", a) for s, a in base.items()]
    stored += [_stored(s, "noise", "sigma=0.1", a - 0.02) for s, a in base.items()]  # precise: ± 0
    stored += [_stored(s, "noise", "sigma=0.5", a - d) for (s, a), d in zip(base.items(), (0.0, 0.03, 0.06))]
    planned = utility_extension(sweep.cells, stored, sweep.utility_ladder)
    seeds = {(c.labels["strength"], c.labels["seed"]) for c in planned}
    assert seeds == {(s, n) for s in ("sigma=0.5", "") for n in range(3, 8)}  # capped at 8 seeds
    for cell in planned:  # the sweep's own spec, with only its seed changed, keyed as a sweep cell
        template = labels_of[cell.labels["strength"]]
        assert {k: v for k, v in cell.spec.items() if k != "seed"} == \
            {k: v for k, v in template.spec.items() if k != "seed"}
        assert cell.spec["seed"] == cell.labels["seed"] and cell.key == Cell("utility", cell.spec, {}).key
    # without a precision there is no ladder
    assert utility_extension(sweep.cells, stored, UtilityLadder()) == []


def test_a_defense_whose_model_no_longer_learns_gets_no_more_seeds():
    sweep = _sweep_cells()
    stored = [_stored(s, "none", "", a) for s, a in ((0, 0.8), (1, 0.9), (2, 0.85))]
    stored += [_stored(s, "noise", "sigma=0.5", a) for s, a in ((0, 0.1), (1, 0.18), (2, 0.12))]
    assert utility_extension(sweep.cells, stored, sweep.utility_ladder) == []


def test_bad_ladder_fields_get_one_line():
    from gradleak.errors import GradleakError

    for field, value in (("precision", 0), ("precision", "x"), ("max_seeds", 1), ("max_seeds", 2.5)):
        with pytest.raises(GradleakError, match=f"utility.{field}"):
            parse_sweep(f"""
grids: [{{datasets: [mnist], models: [lenet], batch_sizes: [1], seeds: [0], attacks: [dlg]}}]
utility: {{seeds: [0, 1], {field}: {value}}}
""", "t.yaml")


def test_under_a_budget_only_the_losses_the_answer_turns_on_get_seeds():
    sweep = _sweep_cells()
    base = {0: 0.80, 1: 0.90, 2: 0.85}
    stored = [_stored(s, "none", "", a) for s, a in base.items()]
    # sigma=0.1: 0.30 ± 0.07, far above the budget of 0.02; sigma=0.5: 0.02 ± 0.07, the budget inside
    stored += [_stored(s, "noise", "sigma=0.1", a - d) for (s, a), d in zip(base.items(), (0.27, 0.30, 0.33))]
    stored += [_stored(s, "noise", "sigma=0.5", a - d) for (s, a), d in zip(base.items(), (0.0, 0.02, 0.04))]
    planned = utility_extension(sweep.cells, stored, sweep.utility_ladder, budget=0.02, named=set())
    assert {c.labels["strength"] for c in planned} == {"sigma=0.5", ""}
    # quoted by the answer (say, the cheapest that holds), its loss must be precise too
    quoted = utility_extension(sweep.cells, stored, sweep.utility_ladder, budget=0.02,
                               named={("mnist", "lenet", "noise", "sigma=0.1")})
    assert {c.labels["strength"] for c in quoted} == {"sigma=0.1", "sigma=0.5", ""}
