"""The conventions every benchmark follows, so `python -m benchmarks NAME --option value` reads
the same for each: one argparse parser per benchmark, named after it, that accepts `--quick`
(the reduced size) beside the benchmark's own options; seeds as `--seeds 0,1,2`; worker
processes as `--workers N`; the result is the JSON object benchmarks/__main__.py prints."""
from __future__ import annotations

import argparse
from collections.abc import Callable

GROUPS = ("attacks", "pipeline")


def parser(name: str, description: str | None = None) -> argparse.ArgumentParser:
    """The parser of `python -m benchmarks NAME`, with the `--quick` every benchmark accepts."""
    made = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=description)
    made.add_argument("--quick", action="store_true", help="the reduced size")
    return made


def seed_list(text: str) -> tuple[int, ...]:
    """`--seeds 0,1,2` as a tuple of ints."""
    return tuple(int(s) for s in text.split(",") if s.strip())


def run_with_workers(run: Callable[..., dict], name: str, argv: list[str]) -> dict:
    """A benchmark's `run_with` for `--quick` and `--workers N` (parallel worker processes)."""
    made = parser(name)
    made.add_argument("--workers", type=int, default=None, help="parallel worker processes")
    args = made.parse_args(argv)
    return run(quick=args.quick, workers=args.workers)
