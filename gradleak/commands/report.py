"""`gradleak report --store results.db --out DIR`: the static HTML report and CSV/JSON exports."""
from __future__ import annotations

import argparse
import json

from ..options import output_dir
from ..report import format_strongest, write_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="results database written by `gradleak sweep`")
    p.add_argument("--out", type=output_dir(), required=True, help="report directory (index.html, images, CSV, JSON)")
    p.add_argument("--json", action="store_true", help="print the strongest-attack table as JSON")
    p.add_argument("--tolerance", default=None, metavar="linkage=0.6,recognizable=0.1",
                   help="judge the store at this tolerance instead of the one it was run with")
    p.add_argument("--max-utility-loss", type=utility_budget, default=None, metavar="LOSS",
                   help="answer with what holds within this utility loss (a fraction of test accuracy, "
                        "at 95%%) instead of the study's utility.max_loss")


def utility_budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from ..leakage import parse_tolerance

    tolerance = parse_tolerance(args.tolerance) if args.tolerance else None
    report = write_report(args.store, args.out, tolerance, args.max_utility_loss)
    if args.json:
        print(json.dumps({"html": report["html"], "strongest": report["strongest"]}))
    else:
        print(format_strongest(report["strongest"], report["modalities"]))
        print(f"report: {report['html']}")
    return 0
