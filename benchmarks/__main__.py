"""Run benchmarks and print one JSON object: `python -m benchmarks [name ...] [--quick]`, or
`python -m benchmarks NAME [--option value ...]` for one benchmark that takes options;
`python -m benchmarks --list` prints the names by group.

Each benchmarks/<group>/bench_<name>.py (groups in benchmarks.common.GROUPS) defines
`run(quick: bool) -> dict`; one that takes options also defines `run_with(argv: list[str]) -> dict`
that parses them with benchmarks.common.parser (e.g. fedavg_scale: `--device cuda --epochs 10`).
"""
from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

from benchmarks.common import GROUPS


def benchmark_modules() -> dict[str, str]:
    """Each benchmark's name and its module (`fedavg_scale` → benchmarks.attacks.bench_fedavg_scale)."""
    here = Path(__file__).parent
    return {m.name[len("bench_"):]: f"benchmarks.{group}.{m.name}" for group in GROUPS
            for m in pkgutil.iter_modules([str(here / group)]) if m.name.startswith("bench_")}


def main(argv: list[str]) -> int:
    modules = benchmark_modules()
    names = sorted(modules)
    if argv and argv[0] in ("--list", "--help", "-h"):
        for group in GROUPS:
            print(f"{group}: {' '.join(n for n in names if modules[n].split('.')[1] == group)}")
        return 0
    quick = "--quick" in argv
    if argv and argv[0] in names and any(a.startswith("--") and a != "--quick" for a in argv[1:]):
        module = importlib.import_module(modules[argv[0]])
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
        module = importlib.import_module(modules[name])
        results[name] = module.run(quick=quick)
        results[name]["benchmark_seconds"] = round(time.perf_counter() - start, 2)
        print(f"benchmark {name} done in {results[name]['benchmark_seconds']} s", file=sys.stderr)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
