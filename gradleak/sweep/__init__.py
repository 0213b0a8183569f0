"""Sweeps: a YAML grid of scenarios, expanded into cells, run in parallel, stored.

Spec (every key optional except `grids`):

    name: demo
    defaults: {lr: 0.1, lpips: alex}        # any AttackRunSpec field, for every cell
    grids:                                   # each grid is a cartesian product
      - datasets: [mnist]
        models: [lenet]
        batch_sizes: [1, 4]
        local_steps: [1]
        seeds: [0]
        defenses:                            # none | "name:k=v" | [chain...] | {name, options}
          - none
          - {name: noise, options: {sigma: [0.001, 0.01]}}   # lists expand: one cell each
        attacks:
          - ig:iterations=300
          - {name: dlg, options: {iterations: [100, 300]}}
          - {name: rtf, threat: malicious}     # per-attack threat / knows
    utility:                                 # optional: one FedAvg utility run per
      options: {rounds: 15}                  # (dataset, model, defenses) of the grids, plus
      seeds: [0]                             # the undefended baseline (UtilitySpec fields)

Every cell is an `AttackRunSpec` (or a utility spec), keyed by a hash of its
full spec; see gradleak.store.

Modules, in the order data flows: `spec` (YAML → cells), `labels` (how cells are
named in tables), `cells` (what one cell computes), `executors` / `ray_executor`
(where cells run), `progress` (live bars), `run` (the driver that stores results).
"""
from __future__ import annotations

from .cells import execute_cell, utility_spec_type
from .labels import attack_labels, chain_labels, dataset_label, defense_label, strength_label
from .run import (
                  cell_title,
                  default_workers,
                  estimated_cost,
                  run_sweep,
                  store_failure,
                  store_result,
                  store_result_record,
)
from .spec import CELL_VERSION, Cell, Sweep, cell_key, load_sweep, parse_sweep

__all__ = ["CELL_VERSION", "Cell", "Sweep", "attack_labels", "chain_labels", "cell_key", "cell_title", "dataset_label",
           "default_workers", "defense_label", "estimated_cost", "execute_cell", "load_sweep", "parse_sweep",
           "run_sweep", "store_failure", "store_result", "store_result_record", "strength_label",
           "utility_spec_type"]
