"""Defense benchmarks (Wei et al. Tabs. 7–9, Liu et al.'s equal-utility comparison, FedAvg utility).

Attack: CPL (Wei et al.) on MNIST, DLG LeNet, batch 1; ASR = share of images with
MSE ≤ 1e-3. Times are wall-clock on a shared 2-core machine.
"""
from __future__ import annotations

import time

from gradleak.attacks import ATTACKS
from gradleak.run.experiment import AttackRunSpec, run_attack
from gradleak.utility import UtilitySpec, run_utility


def _attack_name() -> str:
    return "cpl" if "cpl" in ATTACKS else "ig:distance=l2,tv=0,signed=false,lr=0.05,iterations=1500"


def _asr(defenses=(), local_steps=1, images=4, attack=None) -> dict:
    spec = AttackRunSpec(dataset="mnist", model="lenet", attack=attack or _attack_name(), defenses=tuple(defenses),
                         images=images, local_steps=local_steps, lr=0.1, lpips="none")
    m = run_attack(spec).metrics
    return {"asr": m["asr"], "psnr": round(m["psnr"], 2), "mse": m["mse"]}


def run(quick: bool) -> dict:
    images = 2 if quick else 8
    out: dict = {"attack": _attack_name(), "images": images}
    out["noise"] = {f"sigma={s}": _asr([f"noise:sigma={s}"], images=images) for s in ("1e-4", "1e-2")}
    thetas = (20, 40) if quick else (10, 20, 40, 80)
    out["dgc"] = {f"theta={t}": _asr([f"dgc:theta={t}"], images=images) for t in thetas}
    steps = (1, 10) if quick else (1, 3, 5, 10)
    out["local_iterations"] = {f"steps={t}": _asr(local_steps=t, images=images) for t in steps}
    asrs = [v["asr"] for v in out["local_iterations"].values()]
    out["local_iterations_monotone"] = all(a >= b for a, b in zip(asrs, asrs[1:]))

    start = time.perf_counter()
    base = run_utility(UtilitySpec(rounds=5 if quick else 20))
    out["utility_no_defense"] = {"rounds": base.spec.rounds, "test_accuracy": base.test_accuracy,
                                 "train_loss": round(base.train_loss, 4),
                                 "seconds": round(time.perf_counter() - start, 1)}
    out["equal_utility"] = _equal_utility(quick, base.train_loss)
    return out


def _equal_utility(quick: bool, base_loss: float) -> dict:
    """Liu et al.: for pruning and noise settings of matched utility loss, the best
    attack's error (RMSE; the attack here is CPL) — pruning should leave the larger one."""
    rounds = 3 if quick else 10
    prune_levels = ("0.9",) if quick else ("0.5", "0.9", "0.99")
    # Noise on FedAvg deltas must be large (σ ≥ 1e-2) before it costs utility comparable to pruning 0.9.
    noise_levels = ("1e-3",) if quick else ("1e-3", "1e-2", "3e-2", "1e-1")
    rows = []
    for defense in [f"prune:ratio={p}" for p in prune_levels] + [f"noise:sigma={s}" for s in noise_levels]:
        # Utility uses the same defenses on FedAvg deltas; their scale is lr × steps smaller than a gradient's.
        utility = run_utility(UtilitySpec(rounds=rounds, defenses=(defense,)))
        attack = _asr([defense], images=2 if quick else 4)
        rows.append({"defense": defense, "train_loss": round(utility.train_loss, 4),
                     "test_accuracy": utility.test_accuracy, "attack_rmse": round(attack["mse"] ** 0.5, 4),
                     "attack_asr": attack["asr"]})
    prunes = [r for r in rows if r["defense"].startswith("prune")]
    noises = [r for r in rows if r["defense"].startswith("noise")]
    # For every pruning ratio, the noise level of closest utility (train loss).
    pairs = [{"prune": p, "noise": min(noises, key=lambda n: abs(n["train_loss"] - p["train_loss"]))} for p in prunes]
    closest = min(pairs, key=lambda pn: abs(pn["prune"]["train_loss"] - pn["noise"]["train_loss"]))
    return {"rows": rows, "matched_pairs": pairs, "matched_pair": closest,
            "pruning_leaves_larger_error": all(pn["prune"]["attack_rmse"] > pn["noise"]["attack_rmse"]
                                               for pn in pairs)}
