"""`gradleak flower APP_DIR`: simulate a Flower app with its gradleak hook and
report the leakage of the updates its server received.

    gradleak flower examples/flower_audit --out flower-report/
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ..errors import GradleakError, Terminated
from ..options import output_dir, parse_pairs, ranged

if TYPE_CHECKING:
    from ..modalities import Modality


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("app", help="Flower app folder (its pyproject.toml names the ServerApp and ClientApp)")
    p.add_argument("--out", type=output_dir(), default="gradleak-flower",
                   help="report directory (index.html, results.db)")
    p.add_argument("--num-supernodes", type=ranged(int, 1, 10_000, "--num-supernodes"), default=None,
                   help="simulated clients (default: the app's)")
    p.add_argument("--run-config", action="append", default=[], metavar="KEY=VALUE",
                   help="override the app's run config (repeatable), as `flwr run --run-config`")
    p.add_argument("--rounds", default=None, help="server rounds to audit, comma separated (default: the hook's)")
    p.add_argument("--clients", type=ranged(int, 1, 10_000, "--clients"), default=None,
                   help="clients audited per round (default: the hook's)")
    p.add_argument("--attack", action="append", default=[], metavar="NAME[:key=value,...]",
                   help="attack to run (repeatable; default: the hook's, usually every applicable one)")
    p.add_argument("--budget", default=None, choices=["quick", "standard", "thorough"])
    p.add_argument("--threat", action="append", default=[], choices=["honest", "informed", "malicious"],
                   help="threat model (repeatable; default: the hook's): each attack runs under the weakest "
                        "one given that allows it")
    p.add_argument("--lpips", default=None, choices=["alex", "vgg", "none"])
    p.add_argument("--verbose", action="store_true", help="show Flower's and Ray's logs")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def _overrides(items: list[str]) -> dict[str, str]:
    return parse_pairs(items, lambda item: f"--run-config '{item}': expected KEY=VALUE")


def _rounds(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        rounds = tuple(int(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise GradleakError(f"--rounds '{text}': expected round numbers, e.g. 1,3") from None
    if not rounds or min(rounds) < 1 or max(rounds) > 100_000:
        raise GradleakError(f"--rounds '{text}': rounds are 1 to 100000")
    return rounds


def run(args: argparse.Namespace) -> int:
    if args.clients is not None and args.clients < 1:
        raise GradleakError(f"--clients must be >= 1, got {args.clients}")
    import importlib.util

    # flwr is in requirements-extras.txt: `make demo` and a bare `pip install gradleak` lack it,
    # and the app's own imports would otherwise be what fails
    missing = "it is not installed" if importlib.util.find_spec("flwr") is None else None
    try:
        from ..flower.runner import run_app
    except ImportError as exc:
        missing = str(exc)
    if missing:
        raise GradleakError(f"gradleak flower needs flwr[simulation] ({missing}): run make install, or "
                            "pip install 'flwr[simulation]==1.42.0'")
    from ..analysis import leakage_by_round
    from ..modalities import stored_modality
    from ..report import verdict_in_words, write_report
    from ..store import ResultStore

    try:
        result = run_app(args.app, out=args.out, num_supernodes=args.num_supernodes,
                         run_config=_overrides(args.run_config), rounds=_rounds(args.rounds), clients=args.clients,
                         attacks=args.attack or None, budget=args.budget, threat=tuple(args.threat) or None,
                         lpips=args.lpips, verbose=args.verbose, show_progress=not args.json,
                         leave=_leave if _running_as_program() else None)
    except (KeyboardInterrupt, Terminated) as stop:
        # What finished is stored (each result is committed as it finishes). The interpreter's
        # teardown would spend seconds collecting the objects Flower, Ray and torch created
        # (docs/flower.md), and after a stop inside Flower's simulation it can wait forever on
        # a client thread blocked in Ray: the gradleak program leaves both to the OS.
        if _running_as_program():
            _leave(signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM)
        gc.freeze()
        raise
    if not result.store.is_file():
        raise GradleakError(f"Flower app '{args.app}': no audited update was stored (are the audited rounds "
                            "within num-server-rounds?)")
    report = write_report(result.store, result.out)
    with ResultStore(result.store, create=False) as store:
        cells = store.cells()
    kinds = {c.key: stored_modality(c.modality) for c in cells}
    rounds = leakage_by_round(cells)
    rows = [{k: v for k, v in r.items() if k != 'key'} for r in rounds]
    scores = [score_words_of(r, kinds[r["key"]]) for r in rounds]
    verdicts = verdict_in_words(report["strongest"])
    if args.json:
        print(json.dumps({"html": report["html"], "seconds": round(result.seconds, 3),
                          "num_supernodes": result.num_supernodes, "audited": len(result.captured),
                          "attacks": result.attacks,
                          "verdict": {title: lines for title, lines in verdicts},
                          "by_round": rows}))
        return 0
    resumed = f", {result.attacks['resumed']} attack(s) stored before" if result.attacks.get("resumed") else ""
    print(f"Flower app {result.app_dir.name}: {result.num_supernodes} clients, {len(result.captured)} audited "
          f"updates, {result.seconds:.0f} s{resumed}")
    for title, lines in verdicts:
        print(title)
        for line in lines:
            print(f"  {line}")
    for row, score in zip(rows, scores):
        print(f"  round {row['round']:>3}  client {row['client']:>4}  {row['attack']:32s} {score}")
    print(f"report: {report['html']}")
    return 0


def _running_as_program() -> bool:
    """Whether this process is the gradleak program (`gradleak ...`, `python -m gradleak ...`),
    not a Python session that called gradleak.cli.main."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (spec is not None and spec.name == "gradleak.__main__") or Path(sys.argv[0]).name == "gradleak"


def _leave(signum: int) -> NoReturn:
    """End the gradleak program after Ctrl-C (130) or SIGTERM (143) with one line."""
    word, code = ("interrupted", 130) if signum == signal.SIGINT else ("terminated", 143)
    for stream in (sys.stdout, sys.stderr):
        # from a signal handler that interrupted a write, a flush is a reentrant call: skip it
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            stream.flush()
    # written past Python's buffers, which a signal handler may have interrupted mid-write
    os.write(2, f"gradleak: {word}; what finished is stored, the same command resumes\n".encode())
    _end_own_job()
    os._exit(code)


def _end_own_job() -> None:
    """SIGKILL what is left of this command's own job (the process group it leads, as a
    terminal's job): Ray's helper processes, which a Ctrl-C that reached them mid-simulation
    can leave orphaned. Nothing when this process does not lead its group."""
    me = os.getpid()
    if os.getpgrp() != me or not Path("/proc").is_dir():
        return
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[2]) == me:  # the process group id, after the state and parent id
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def score_words_of(row: dict, kind: Modality) -> str:
    """One audited update's leakage in its data's own scores (token sequences: with the share
    recovered exactly)."""
    return kind.round_words(row)
