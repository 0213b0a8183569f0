"""The reconstruction-robustness bound (Balle, Cherubin and Hayes, IEEE S&P 2022) from DP-SGD's
Rényi curve, and where the analysis puts it: beside a DP defense's measured grade."""
import math
import random

import pytest

from gradleak.defenses import make_defense
from gradleak.rero import RDP_ORDERS, reconstruction_bound
from gradleak.store import CellRecord
from gradleak.utility import UtilitySpec, run_utility


def _gaussian(sigma: float) -> list[tuple[float, float]]:
    # one full-batch Gaussian step: ε_α = α / (2σ²)
    return [(a, a / (2 * sigma ** 2)) for a in RDP_ORDERS]


def test_the_bound_is_the_closed_form_minimum_and_never_below_chance():
    chance = 1 / 1001
    for sigma in (0.5, 1.0, 4.0):
        expected = min(min(1.0, (chance * math.exp(a / (2 * sigma ** 2))) ** ((a - 1) / a)) for a in RDP_ORDERS)
        assert reconstruction_bound(_gaussian(sigma), chance) == pytest.approx(max(expected, chance))
    bounds = [reconstruction_bound(_gaussian(s), chance) for s in (0.3, 1.0, 3.0, 30.0)]
    assert bounds == sorted(bounds, reverse=True)  # more noise, a lower bound
    assert bounds[0] > 0.9 and chance <= bounds[-1] < 2 * chance  # little noise: no guarantee; much: chance
    assert reconstruction_bound(_gaussian(0.01), chance) == 1.0  # ε_α in the thousands: no bound, no overflow
    with pytest.raises(ValueError):
        reconstruction_bound(_gaussian(1.0), 0.0)


def test_dpsgd_accounts_its_curve_and_the_utility_run_keeps_the_worst_clients():
    dp = make_defense("dpsgd:clip=1,sigma=1")
    curve = dp.rdp(sample_rate=0.01, steps=100, orders=list(RDP_ORDERS))
    assert len(curve) == len(RDP_ORDERS) and all(b >= a for a, b in zip(curve, curve[1:]))  # ε_α grows with α
    assert make_defense("noise:sigma=1").rdp(sample_rate=1.0, steps=1, orders=[2.0]) is None
    result = run_utility(UtilitySpec(dataset="mnist", defenses=("dpsgd:clip=1,sigma=1",), clients=2, per_round=2,
                                     rounds=1, local_steps=2, local_batch_size=16, seed=0))
    stored = result.to_json()
    assert stored["epsilon"] is not None and len(stored["rdp"]) == len(RDP_ORDERS)
    undefended = run_utility(UtilitySpec(dataset="mnist", clients=2, per_round=2, rounds=1, local_steps=2,
                                         local_batch_size=16, seed=0)).to_json()
    assert "rdp" not in undefended


def _attack_cell(seed: int, defense: str, strength: str) -> CellRecord:
    rng = random.Random(seed)
    values = [rng.random() for _ in range(8)]
    mean = sum(values) / 8
    sd = (sum((v - mean) ** 2 for v in values) / 7) ** 0.5
    labels = {"threat": "honest", "dataset": "mnist", "model": "lenet", "batch_size": 4, "local_steps": 1,
              "seed": seed, "defense": defense, "strength": strength, "attack": "ig", "attack_spec": "ig"}
    metrics = {"examples": 8, "asr": 0.0, "linkage": mean, "linkage_sd": sd, "recognizable": 0.0, "reid": 0.0,
               "reid_chance": 1 / 1001, "psnr": 8.0, "mse": 0.15}
    return CellRecord(f"a{seed}{defense}", "attack", "t", {"seed": seed}, labels, metrics,
                      {"ladder": {"decision": "saturated", "saturated": True, "iterations": 400}}, 1.0)


def _utility_cell(seed: int, defense: str, strength: str, metrics: dict, extras: dict) -> CellRecord:
    labels = {"dataset": "mnist", "model": "lenet", "defense": defense, "strength": strength, "seed": seed}
    return CellRecord(f"u{seed}{defense}", "utility", "t", {"dataset": "mnist"}, labels,
                      {"test_accuracy": 0.8, **metrics}, extras, 1.0)


def test_a_dp_defense_shows_its_epsilon_and_bound_beside_its_grade_and_others_show_nothing():
    from gradleak.analysis import strongest_attacks

    curve = [list(p) for p in _gaussian(2.0)]
    cells = [_attack_cell(s, d, st) for s in (0, 1) for d, st in (("dpsgd", "sigma=2"), ("none", ""))]
    cells += [_utility_cell(s, "dpsgd", "sigma=2", {"epsilon": 3.0}, {"rdp": curve}) for s in (0, 1)]
    cells += [_utility_cell(s, "none", "", {}, {}) for s in (0, 1)]
    entries = {e["defense"]: e for e in strongest_attacks(cells)}
    dp = entries["dpsgd"]
    assert dp["epsilon"] == pytest.approx(3.0)
    assert dp["rero_bound"] == pytest.approx(reconstruction_bound([tuple(p) for p in curve], 1 / 1001))
    assert dp["rero_chance"] == pytest.approx(1 / 1001) and "by any attacker" in dp["rero_text"]
    assert "rero_bound" not in entries["none"] and "epsilon" not in entries["none"]
