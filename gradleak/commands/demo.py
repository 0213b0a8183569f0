"""`gradleak demo`: the embedded default sweep (gradleak/configs/demo.yaml) on
MNIST/LeNet, stored in DIR/results.db, reported to DIR/index.html, and the
strongest-attack table printed."""
from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

from ..options import MAX_WORKERS, output_dir, ranged
from ..report import format_strongest, write_report
from ..store import ResultStore
from ..sweep import parse_sweep, run_sweep
from .sweep import report_failures


def demo_spec_text() -> str:
    return resources.files("gradleak").joinpath("configs/demo.yaml").read_text()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=output_dir(), default="gradleak-demo", help="report directory (also holds results.db)")
    p.add_argument("--workers", type=ranged(int, 1, MAX_WORKERS, "--workers"), default=None,
                   help="local worker processes (default: number of cores)")
    p.add_argument("--executor", default="local", choices=["local", "ray"])
    p.add_argument("--address", default=None, help="Ray cluster address (with --executor ray)")
    p.add_argument("--json", action="store_true", help="no progress bars; print one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    sweep = parse_sweep(demo_spec_text(), "gradleak/configs/demo.yaml")
    out.mkdir(parents=True, exist_ok=True)
    with ResultStore(out / "results.db") as store:
        summary = run_sweep(sweep, store, workers=args.workers, executor=args.executor,
                            address=args.address, show_progress=not args.json)
    report = write_report(out / "results.db", out)
    if args.json:
        print(json.dumps({"sweep": summary, "html": report["html"], "strongest": report["strongest"]}))
    else:
        print(format_strongest(report["strongest"], report["modalities"]))
        print(f"{summary['cells']} cells ({summary['skipped']} already stored) in {summary['seconds']:.0f} s; "
              f"report: {report['html']}")
    return report_failures(summary["failed"])
