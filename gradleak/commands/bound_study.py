"""`gradleak bound-study`: sweep d, m, B and defense strength, run the tensor attack, and plot the
measured error between the lower bound and the upper-bound scaling (PNG + JSON + CSV + HTML fragment)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..options import output_dir
from ..theory.study import run_study


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=output_dir(), default="results/bound-study", help="output directory")
    p.add_argument("--quick", action="store_true", help="smaller sweep (fewer seeds and grid points)")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    result = run_study(quick=args.quick, out=Path(args.out))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    s = result["slopes"]
    lip = result["lipschitz_checks"]
    print(f"cells: {len(result['cells'])} ({result['draws']} draws), measured < lower bound in "
          f"{result['lower_bound_violations']} draws")
    print(f"slopes (theory: −0.5 in m, +0.5 in d): measured m {s['measured_vs_m']:+.3f}, d {s['measured_vs_d']:+.3f}, "
          f"B {s['measured_vs_B']:+.3f}; lower (z²+z³) m {s['lower_numeric_vs_m']:+.3f}, "
          f"d {s['lower_numeric_vs_d']:+.3f}; "
          f"lower (tanh) m {lip['lower_vs_m']:+.3f}, d {lip['lower_vs_d']:+.3f}")
    print("wrote " + ", ".join(result.get("files", [])))
    return 0
