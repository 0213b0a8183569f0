"""How often the verdict calls a leak where there is none, and how many examples "holds" takes.

Null studies are simulated at the level the verdict reads: every attack's examples carry
nothing about their originals, so each example's linkage AUC is its rank among a 1,000-example
gallery (uniform) and it is recognised only when it ranks its original first under one of two
distances (chance 2/1001; the perceptual bar can only lower that). Each simulated setting runs
`attacks` attacks on `examples` examples each, and is judged by gradleak.analysis as a sweep's
setting is. Reported: the rate of settings graded copies/recognizable/linkable (false leaks),
the rate judged "holds", and the rate of studies of `settings` settings with at least one
false leak.
"""
from __future__ import annotations

import random

GALLERY = 1000
CHANCE = 2 / (GALLERY + 1)


def _null_setting(rng: random.Random, attacks: int, examples: int, seeds: int = 2) -> list:
    from gradleak.store import CellRecord

    cells = []
    per_seed = examples // seeds
    for a in range(attacks):
        for seed in range(seeds):
            ranks = [min(rng.randrange(GALLERY + 1), rng.randrange(GALLERY + 1)) for _ in range(per_seed)]
            # the example's AUC averages the two distances' ranks, each uniform alone
            values = [1 - (rng.randrange(GALLERY + 1) + rng.randrange(GALLERY + 1)) / (2 * GALLERY)
                      for _ in range(per_seed)]
            recognised = sum(r == 0 for r in ranks)
            mean = sum(values) / per_seed
            sd = (sum((v - mean) ** 2 for v in values) / (per_seed - 1)) ** 0.5
            labels = {"threat": "honest", "dataset": "null", "model": "m", "batch_size": 1, "local_steps": 1,
                      "seed": seed, "defense": "d", "strength": "", "attack": f"a{a}", "attack_spec": f"a{a}"}
            metrics = {"examples": per_seed, "asr": 0.0, "linkage": mean, "linkage_sd": sd,
                       "recognizable": recognised / per_seed, "reid": recognised / per_seed, "reid_chance": CHANCE}
            ladder = {"decision": "saturated", "saturated": True, "iterations": 400}
            cells.append(CellRecord(f"{a}-{seed}", "attack", "null", {}, labels, metrics, {"ladder": ladder}, 1.0))
    return cells


def run(quick: bool = False) -> dict:
    from gradleak.analysis import strongest_attacks

    rng = random.Random(0)
    trials = 300 if quick else 2000
    rows = []
    for attacks, examples in ((3, 8), (4, 40), (5, 64)):
        grades = {"copies": 0, "recognizable": 0, "linkable": 0, "holds": 0}
        for _ in range(trials):
            (entry,) = strongest_attacks(_null_setting(rng, attacks, examples))
            if entry["grade"]:
                grades[entry["grade"]] += 1
            elif entry["verdict"] == "holds":
                grades["holds"] += 1
        false = (grades["copies"] + grades["recognizable"] + grades["linkable"]) / trials
        rows.append({"attacks": attacks, "examples_per_attack": examples, "settings": trials,
                     "false_leak_rate": round(false, 4), "holds_rate": round(grades["holds"] / trials, 4),
                     "grades": grades,
                     # a demo-sized study: 20 settings, independent
                     "study_of_20_any_false_leak": round(1 - (1 - false) ** 20, 4)})
    return {"trials_per_row": trials, "rows": rows}
