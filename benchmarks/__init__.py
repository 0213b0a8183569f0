"""gradleak's benchmarks: `python -m benchmarks [name ...] [--quick]` (benchmarks/__main__.py)."""
from __future__ import annotations


def run_with_workers(run, name: str, argv: list[str]) -> dict:
    """A benchmark's `run_with` for `--quick` and `--workers N` (parallel worker processes)."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    return run(quick=args.quick, workers=args.workers)
