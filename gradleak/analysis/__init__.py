"""Liu et al.'s defense criterion over a results store, as verdicts a practitioner can act on.

- `cells`: reading a store's cells (scenario, ladder, intervals over seeds);
- `rows`: attack cells pooled per attack, with their leakage evidence (gradleak.leakage);
- `verdict`: the grade per defense setting, from its attacks' evidence;
- `wording`: the verdict sentence per setting and the answer line per scenario;
- `costs`: utility loss, the untrained-baseline rule and the frontier;
- `studies`: Wei et al.-style studies, leakage per round and the report's matrices.
"""
from __future__ import annotations

from .cells import SCENARIO_KEYS, cell_ladder, cell_saturated, dataset_modalities, interval95
from .costs import NEAR_CHANCE, NEAR_UNIFORM_NATS, did_not_train, utility_metric, utility_table
from .rows import attack_rows, cell_evidence, with_weaker_threats
from .studies import MATRIX_KEYS, MATRIX_ROW_KEYS, best_reconstructions, leakage_by_round, study_tables
from .verdict import ATTACK_METRICS, GRADES, strongest_attacks, study_tolerance, study_utility_budget
from .wording import HOLDS_MIN_SEEDS, answer, budget_range, is_within, loss_high, percent, setting_name, verdict

__all__ = ["ATTACK_METRICS", "GRADES", "HOLDS_MIN_SEEDS", "MATRIX_KEYS", "MATRIX_ROW_KEYS", "NEAR_CHANCE",
           "NEAR_UNIFORM_NATS", "SCENARIO_KEYS", "answer", "attack_rows", "best_reconstructions", "budget_range",
           "cell_evidence", "cell_ladder", "cell_saturated", "dataset_modalities", "did_not_train", "interval95",
           "is_within", "loss_high",
           "leakage_by_round",
           "percent", "setting_name", "strongest_attacks", "study_tables", "study_tolerance", "study_utility_budget",
           "utility_metric",
           "utility_table", "verdict", "with_weaker_threats"]
