"""`gradleak` command line. Each sub-command lives in gradleak/commands/<name>.py
with `add_arguments(parser)` and `run(args) -> int`; add one line to COMMANDS.

Bad input (and an internal fault) prints one line on stderr and exits with code 2;
Ctrl-C exits with 130 and SIGTERM with 143, after the stores are left consistent.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import warnings

from .errors import GradleakError, Terminated

COMMANDS: dict[str, tuple[str, str]] = {
    "audit": ("gradleak.commands.audit", "every applicable attack on your model and data, with an HTML report"),
    "attack": ("gradleak.commands.attack", "run one attack scenario and score it"),
    "flower": ("gradleak.commands.flower", "simulate a Flower app with its gradleak hook and report its leakage"),
    "inspect-model": ("gradleak.commands.inspect_model", "checks a client would run on a malicious server's model"),
    "list": ("gradleak.commands.listing", "list attacks, defenses, datasets or models"),
    "demo": ("gradleak.commands.demo", "run the main job on the embedded default and write the report"),
    "sweep": ("gradleak.commands.sweep", "run a sweep spec (YAML) into a results store, skipping finished cells"),
    "report": ("gradleak.commands.report", "write the static HTML report of a results store"),
    "calibrate": ("gradleak.commands.calibrate", "search a defense's strength for the weakest setting that holds"),
    "bound": ("gradleak.commands.bound", "two-layer-net reconstruction lower bound + Table 1 scalings per defense"),
    "bound-study": ("gradleak.commands.bound_study", "sweep d, m, B, defenses: tensor attack vs. the bounds"),
    "utility": ("gradleak.commands.utility", "FedAvg utility (loss, accuracy, ε) of a defense on non-IID clients"),
    "train-postprocessor": ("gradleak.commands.train_postprocessor", "train ROG's enhancement U-Net on offline photos"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse would print the usage block)
        # "gradleak: error: " comes with every message: name only the sub-command, if any
        command = self.prog.partition(" ")[2]
        raise GradleakError(f"{command}: {message}" if command else message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gradleak", description="Gradient-leakage evaluation for federated learning.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def _on_sigterm(_signum, _frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if on_main_thread else None
    try:
        return _run(argv)
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _run(argv: list[str] | None) -> int:
    # Warnings are held back while the command runs: a failing command prints its one
    # line and nothing else; a command that succeeds shows them at the end.
    with warnings.catch_warnings(record=True) as caught:
        code = _dispatch(argv)
    if code == 0:
        for w in caught:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return code


def _dispatch(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args._module.run(args) or 0)
    except GradleakError as exc:
        print(f"gradleak: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gradleak: interrupted; what finished is stored, the same command resumes", file=sys.stderr)
        return 130
    except Terminated:
        print("gradleak: terminated; what finished is stored, the same command resumes", file=sys.stderr)
        return 143
    except BrokenPipeError:  # stdout closed early (e.g. piped into head): nothing left to say
        sys.stdout = open(os.devnull, "w")
        return 1
    except Exception as exc:  # an internal fault, not bad input: still one line unless debugging
        if os.environ.get("GRADLEAK_DEBUG"):
            raise
        if isinstance(exc, OSError) and exc.filename is not None:
            # a path no reader looked up first (gradleak.options.path_kind does): bad input, one line
            name = str(exc.filename)
            shown = name if len(name) <= 80 else name[:77] + "..."
            print(f"gradleak: error: cannot use '{shown}': {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"gradleak: internal error: {type(exc).__name__}: {_one_line(exc)[:500]} "
              "(set GRADLEAK_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
