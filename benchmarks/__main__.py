"""Run benchmarks and print one JSON object: `python -m benchmarks [name ...] [--quick]`.

Each benchmarks/bench_<name>.py defines `run(quick: bool) -> dict`.
"""
from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    workers = None
    if "--workers" in argv:  # parallel cells, for the benchmarks that run a sweep
        at = argv.index("--workers")
        try:
            workers = int(argv[at + 1])
        except (IndexError, ValueError):
            print("benchmarks: --workers takes a number of processes", file=sys.stderr)
            return 2
        argv = argv[:at] + argv[at + 2:]
    wanted = [a for a in argv if not a.startswith("--")]
    names = sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                   if m.name.startswith("bench_"))
    unknown = [w for w in wanted if w not in names]
    if unknown:
        print(f"benchmarks: unknown benchmark '{unknown[0]}'; choose from: {', '.join(names)}", file=sys.stderr)
        return 2
    results = {}
    for name in wanted or names:
        start = time.perf_counter()
        module = importlib.import_module(f"benchmarks.bench_{name}")
        results[name] = module.run(quick=quick, workers=workers) if workers is not None else module.run(quick=quick)
        results[name]["benchmark_seconds"] = round(time.perf_counter() - start, 2)
        print(f"benchmark {name} done in {results[name]['benchmark_seconds']} s", file=sys.stderr)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
