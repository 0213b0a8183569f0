"""`gradleak calibrate SPEC.yaml --defense noise --low 0.001 --high 1 --store results.db`: the
weakest setting of a defense family that holds, bracketed within a factor by search
(gradleak.sweep.calibrate); each probe is stored, so a search resumes where it stopped."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..options import MAX_WORKERS, output_file, ranged
from ..sweep.calibrate import PROBE_EXAMPLES_FACTOR


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="sweep spec (YAML): the scenario and the attacks (its defenses are replaced)")
    p.add_argument("--defense", required=True, metavar="NAME[:key=value,...]",
                   help="the family: a defense with a strength order and its other options (noise, dpsgd:clip=1)")
    p.add_argument("--low", type=ranged(float, 1e-12, 1e12, "--low"), required=True,
                   help="the smallest value of the strength option to search")
    p.add_argument("--high", type=ranged(float, 1e-12, 1e12, "--high"), required=True,
                   help="the largest value of the strength option to search")
    p.add_argument("--factor", type=ranged(float, 1.01, 1000, "--factor"), default=2.0,
                   help="stop when the bracket is within this factor (default 2)")
    p.add_argument("--store", type=output_file("--store"), required=True,
                   help="results database (SQLite; created if missing): every probe's cells")
    p.add_argument("--max-examples", type=ranged(int, 1, 100_000, "--max-examples"), default=None,
                   help="examples per attack a probe's sample ladder may judge on (default: "
                        f"{PROBE_EXAMPLES_FACTOR} times the study's "
                        "samples.max_examples, so that probes near the frontier are decided)")
    p.add_argument("--workers", type=ranged(int, 1, MAX_WORKERS, "--workers"), default=None)
    p.add_argument("--json", action="store_true", help="print the search as one JSON object")


def round_epsilon(setting: str, sweep) -> float | None:
    """A DP defense's ε for one round of the first cell's client (its local steps at its
    sampling rate, δ = 1e-5): what the audited update cost in privacy. None for other defenses."""
    import math

    from ..defenses import make_defense
    from ..sweep.cells import attack_run_spec

    spec = attack_run_spec(sweep.attack_cells[0].spec)
    training, batch = spec.training(), spec.batch_size
    steps = training.num_steps(batch)
    epsilon = make_defense(setting).privacy(sample_rate=training.step_batch_size(batch) / batch, steps=steps,
                                             delta=1e-5)
    return None if epsilon is None or not math.isfinite(epsilon) else epsilon


def run(args: argparse.Namespace) -> int:
    from ..analysis import strongest_attacks
    from ..errors import GradleakError
    from ..options import ComponentSpec, parse_chain
    from ..store import ResultStore
    from ..sweep import run_sweep
    from ..sweep.calibrate import Probe, family, probe_sweep, search, seeds_note
    from ..sweep.labels import chain_labels

    path = Path(args.spec)
    if not path.is_file():
        raise GradleakError(f"calibrate: sweep file '{args.spec}' not found")
    text = path.read_text()
    spec, option, direction = family(args.defense)

    with ResultStore(args.store) as store:
        def setting_of(value: float) -> str:
            return str(ComponentSpec(spec.name, {**spec.options, option: repr(value)}))

        def evaluate(value: float) -> Probe:
            value = float(f"{value:.4g}")  # stable store keys: a value probed again is found again
            setting = setting_of(value)
            sweep = probe_sweep(text, setting, str(path), args.max_examples)
            run_sweep(sweep, store, workers=args.workers, show_progress=False)
            labels = chain_labels(parse_chain([setting]))
            mine = [e for e in strongest_attacks(store.cells())
                    if e["defense"] == labels["defense"] and e["strength"] == labels["strength"]]
            if not mine:
                raise GradleakError(f"calibrate: no verdict for {setting} (every cell failed?)")
            verdict = "holds" if all(e["verdict"] == "holds" for e in mine) else \
                next(e["verdict"] for e in mine if e["verdict"] != "holds")
            if not args.json:
                print(f"  {setting}: {verdict}", flush=True)
            return Probe(value, verdict, " | ".join(e["verdict_text"] for e in mine), round_epsilon(setting, sweep))

        first = probe_sweep(text, setting_of(args.low), str(path), args.max_examples)

        def measure(value: float) -> float | None:  # a DP family's ε (the training is the same at every value)
            return round_epsilon(setting_of(value), first)

        result = search(evaluate, spec, option, direction, args.low, args.high, args.factor, measure=measure)
    note = seeds_note(first)
    if args.json:
        print(json.dumps({**result.to_dict(), "note": note}))
    else:
        print(result.answer())
        for violation in result.order_violations:
            print(f"  order violated: {violation}")
        if note:
            print(f"  {note}")
    return 0
