"""`gradleak sweep SPEC.yaml --store results.db`: run every cell of a sweep not yet stored."""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..options import MAX_WORKERS, check_device, output_file, ranged
from ..store import ResultStore
from ..sweep import load_sweep, run_sweep


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="sweep spec (YAML)")
    p.add_argument("--store", type=output_file("--store"), required=True,
                   help="results database (SQLite; created if missing)")
    p.add_argument("--workers", type=ranged(int, 1, MAX_WORKERS, "--workers"), default=None,
                   help=f"local worker processes, 1 to {MAX_WORKERS} (default: number of cores)")
    p.add_argument("--executor", default="local", choices=["local", "ray"])
    p.add_argument("--address", default=None, help="Ray cluster address (with --executor ray), e.g. auto")
    p.add_argument("--json", action="store_true", help="no progress bars; print one JSON summary on stdout")


def run(args: argparse.Namespace) -> int:
    sweep = load_sweep(args.spec)  # validated in full before anything runs
    if args.executor == "local" or not (args.address or os.environ.get("RAY_ADDRESS")):
        # the cells run on this machine (local workers or a local Ray instance): their devices must exist here
        for device in sorted({cell.spec.get("device", "auto") for cell in sweep.attack_cells}):
            check_device(device)
    with ResultStore(args.store) as store:
        summary = run_sweep(sweep, store, workers=args.workers, executor=args.executor,
                            address=args.address, show_progress=not args.json)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"sweep '{summary['sweep']}': {summary['cells']} cells, {summary['skipped']} already stored, "
              f"{summary['ran']} run in {summary['seconds']:.1f} s → {args.store}")
    return report_failures(summary["failed"])


def report_failures(failed: list[dict]) -> int:
    """One stderr line per cell that raised; exit status 1 when any did (the other cells are
    stored, the failures are in the store and the report, and the next run retries them)."""
    for failure in failed:
        print(f"cell {failure['key'][:8]} ({failure['cell']}) failed: {failure['error']}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} cell(s) failed; run the sweep again to retry them", file=sys.stderr)
    return 1 if failed else 0
