"""Run benchmarks and print one JSON object: `python -m benchmarks [name ...] [--quick]`, or
`python -m benchmarks NAME [--option value ...]` for one benchmark that takes options.

Each benchmarks/bench_<name>.py defines `run(quick: bool) -> dict`; one that takes options also
defines `run_with(argv: list[str]) -> dict` (e.g. fedavg_scale: `--device cuda --epochs 10`).
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
    names = sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                   if m.name.startswith("bench_"))
    if argv and argv[0] in names and any(a.startswith("--") and a != "--quick" for a in argv[1:]):
        module = importlib.import_module(f"benchmarks.bench_{argv[0]}")
        if not hasattr(module, "run_with"):
            print(f"benchmarks: '{argv[0]}' takes no options but --quick", file=sys.stderr)
            return 2
        start = time.perf_counter()
        result = module.run_with(argv[1:])
        result["benchmark_seconds"] = round(time.perf_counter() - start, 2)
        print(json.dumps({argv[0]: result}, indent=2))
        return 0
    wanted = [a for a in argv if not a.startswith("--")]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        print(f"benchmarks: unknown benchmark '{unknown[0]}'; choose from: {', '.join(names)}", file=sys.stderr)
        return 2
    results = {}
    for name in wanted or names:
        start = time.perf_counter()
        module = importlib.import_module(f"benchmarks.bench_{name}")
        results[name] = module.run(quick=quick)
        results[name]["benchmark_seconds"] = round(time.perf_counter() - start, 2)
        print(f"benchmark {name} done in {results[name]['benchmark_seconds']} s", file=sys.stderr)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
