"""Theory bound study: fitted slopes and per-cell numbers (gradleak.theory.study)."""
from __future__ import annotations

from gradleak.theory.study import run_study


def run(quick: bool) -> dict:
    result = run_study(quick=quick)
    cells = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in c.items()
              if k in ("sweep", "d", "m", "batch_size", "defense", "measured", "lower_numeric", "upper_scaling",
                       "upper_calibrated", "min_measured_over_lower", "pruned_fraction_hat")}
             for c in result["cells"]]
    slopes = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result["slopes"].items()}
    lip = result["lipschitz_checks"]
    return {"slopes": slopes,
            "lower_bound_tanh": {"vs_m": round(lip["lower_vs_m"], 4), "vs_d": round(lip["lower_vs_d"], 4),
                                 "prune_threshold": round(lip["prune_threshold"], 4),
                                 "prune_bound_over_unpruned": {str(p): round(v, 4) for p, v in
                                                               lip["prune_bound_over_unpruned"].items()}},
            "upper_constant": round(result["upper_constant"], 4),
            "lower_bound_violations": result["lower_bound_violations"], "draws": result["draws"],
            "cells": cells}
