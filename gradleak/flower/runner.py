"""Run a Flower app directory as a local simulation with its gradleak audit on.

The app is what `flwr run` would run: `pyproject.toml` names the ServerApp and
ClientApp (`[tool.flwr.app.components]`), its run config (`[tool.flwr.app.config]`)
and the simulation's number of SuperNodes (`[tool.flwr.federations]`). The app's
modules must define a `gradleak.flower.FlowerAudit` hook. Everything runs on this
machine with Flower's Ray simulation backend; nothing is downloaded.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api import TrainingMismatchWarning
from ..errors import GradleakError, Terminated
from ..fl import TrainingSpec
from ..options import path_kind
from .hook import OUT_ENV, CapturedUpdate, FlowerAudit


@dataclass
class FlowerRun:
    """What one audited simulation produced."""

    app_dir: Path
    out: Path
    seconds: float
    num_supernodes: int
    run_config: dict
    captured: list[CapturedUpdate] = field(default_factory=list)  # every audited update, in order
    # the clients' training, as the run config declares it (each captured update carries its
    # client's own, with that client's shuffling seed)
    training: TrainingSpec | None = None
    # the attack phase: attacks run, found stored by an earlier run (resumed), not run; seconds
    attacks: dict = field(default_factory=dict)

    @property
    def store(self) -> Path:
        return self.out / "results.db"


def read_app(app_dir: str | Path) -> dict:
    """The app's components, run config (flattened) and default SuperNode count."""
    import tomllib

    root = Path(app_dir).expanduser()
    project = root / "pyproject.toml"
    if path_kind(project, "Flower app") != "file":
        raise GradleakError(f"Flower app '{root}': no pyproject.toml (is it a Flower app folder?)")
    try:
        doc = tomllib.loads(project.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GradleakError(f"Flower app '{root}': pyproject.toml is not valid TOML ({exc})") from None
    app = doc.get("tool", {}).get("flwr", {}).get("app", {})
    components = app.get("components", {})
    for key in ("serverapp", "clientapp"):
        if not isinstance(components.get(key), str) or ":" not in components[key]:
            raise GradleakError(f"Flower app '{root}': [tool.flwr.app.components] needs {key} = 'module:object'")
    federations = doc.get("tool", {}).get("flwr", {}).get("federations", {})
    default = federations.get(federations.get("default", ""), {}) if isinstance(federations, dict) else {}
    supernodes = (default.get("options", {}) or {}).get("num-supernodes") if isinstance(default, dict) else None
    return {"root": root.resolve(), "components": components, "config": _flatten(app.get("config", {})),
            "num_supernodes": supernodes}


def run_app(app_dir: str | Path, *, out: str | Path = "gradleak-flower", num_supernodes: int | None = None,
            run_config: dict[str, Any] | None = None, rounds: tuple[int, ...] | None = None,
            clients: int | None = None, attacks: Any = None, budget: str | None = None,
            threat: str | tuple[str, ...] | None = None, lpips: str | None = None, verbose: bool = False,
            show_progress: bool = False, leave: Callable[[int], Any] | None = None) -> FlowerRun:
    """Simulate the app with its FlowerAudit hook capturing the audited updates, then attack
    them in this process, storing each result in `out` as it finishes; a rerun with the same
    `out` skips what is stored. The keyword arguments after `run_config` override the hook's
    own settings; `show_progress` prints a line on stderr per client and attack. `leave`, if
    given, is called with the signal number of a Ctrl-C or SIGTERM that arrives while Flower
    simulates, in place of raising through Flower (the gradleak program ends the process there:
    nothing of the audit is stored yet, and Flower's teardown of Ray races its client threads)."""
    app = read_app(app_dir)
    config = dict(app["config"])
    for key, value in (run_config or {}).items():
        if key not in config:
            raise GradleakError(f"--run-config: the app has no config key '{key}'; keys: {', '.join(config)}")
        config[key] = _like(config[key], value, key)
    supernodes = int(num_supernodes or app["num_supernodes"] or 0)
    if supernodes < 1:
        raise GradleakError("Flower app: set the number of SuperNodes (--num-supernodes, or "
                            "options.num-supernodes in the app's default federation)")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Flower's telemetry would try to reach the network; Ray's workers inherit this environment.
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # no GPU is asked for: keep Ray quiet
    os.environ[OUT_ENV] = str(out)
    root = str(app["root"])
    if root not in sys.path:
        sys.path.insert(0, root)
    server_app, server_module = _load(app["components"]["serverapp"], root)
    client_app, client_module = _load(app["components"]["clientapp"], root)
    audits = _find_audits(server_module, client_module)
    for guard in _find_guards(server_module, client_module):
        guard.check(config)  # a bad guard configuration: one line now, not in round 1 of every client
    # The hook lives in the app's module, so a second run in this process meets the same
    # object: this run's settings are set for the run and restored afterwards.
    overrides = {"out": str(out), "rounds": tuple(rounds) if rounds is not None else None, "clients": clients,
                 "attacks": attacks, "budget": budget, "threat": threat, "lpips": lpips,
                 "defer_attacks": True}
    saved = [{name: getattr(a, name) for name in overrides} for a in audits]
    for audit in audits:
        audit.captured.clear()
        for name, value in overrides.items():
            if value is not None:
                setattr(audit, name, value)
    start = time.perf_counter()
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    if not verbose:  # Flower logs every round; keep the terminal for the audit's own output
        flwr_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            if not verbose:  # Ray's start-up FutureWarnings are not the user's concern
                warnings.simplefilter("ignore")
            # but a declared training that does not reproduce a captured update is, every time
            warnings.filterwarnings("always", category=TrainingMismatchWarning)
            _simulate(server_app, client_app, supernodes, config, root, verbose, leave)
        flwr_logger.setLevel(level)
        # Flower has shut Ray down: the attacks run here, in the main thread, where Ctrl-C stops
        # them at once and each finished attack is already stored
        counts: dict = {}
        for audit in audits:
            for name, value in audit.attack_captured(run_config=config, show_progress=show_progress).items():
                counts[name] = counts.get(name, 0) + value
        captured = [c for a in audits for c in a.captured]
        training = audits[0].training_from(config)
    finally:
        flwr_logger.setLevel(level)
        for audit, before in zip(audits, saved):
            for name, value in before.items():
                setattr(audit, name, value)
    return FlowerRun(app["root"], out, time.perf_counter() - start, supernodes, config, captured, training, counts)


def _simulate(server_app, client_app, supernodes: int, config: dict, root: str, verbose: bool,
              leave: Callable[[int], Any] | None = None) -> None:
    from flwr.app import Context, RecordDict
    from flwr.common.constant import RUN_ID_NUM_BYTES, SUPERLINK_NODE_ID, TASK_ID_NUM_BYTES
    from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    # As flwr.simulation.run_simulation builds its run, plus the run-config overrides, so the
    # same config reaches the ServerApp (its Context) and every ClientApp (read from the app
    # folder and fused with the overrides), as under `flwr run`.
    run_id = generate_rand_int_from_bytes(RUN_ID_NUM_BYTES)
    run = Run.create_empty(run_id=run_id)
    run.primary_task_id = generate_rand_int_from_bytes(TASK_ID_NUM_BYTES)
    run.federation_id = NOOP_FEDERATION_ID
    run.override_config = dict(config)
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    context = Context(run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(), run_config=dict(config))
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": max(1, min(2, os.cpu_count() or 1)), "logging_level": "ERROR",
                             "log_to_driver": verbose}}
    with _interruptible(verbose, leave):
        _run_simulation(num_supernodes=supernodes, exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
                        client_app=client_app, server_app=server_app, backend_config=backend,
                        server_app_context=context, app_dir=root, run=run, is_app=True, verbose_logging=verbose)


@contextlib.contextmanager
def _interruptible(verbose: bool, leave: Callable[[int], Any] | None = None):
    """Ctrl-C or SIGTERM while Flower simulates: one line, not Flower's logs of every client
    whose Ray actor went down with the run, and no wait on the ServerApp thread Flower
    started, which would wait for those clients' replies (and the interpreter for it).
    With `leave`, the signal goes to it at once: raised through Flower, the stop runs
    Flower's ray.shutdown while client threads still call into Ray, and Ray's core worker
    then ends the process itself with exit code 1 (seen once in CI)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = set(threading.enumerate())
    installed = {}

    def quiet(previous):
        def handler(signum, frame):
            if not verbose:
                logging.getLogger("flwr").setLevel(logging.CRITICAL + 1)
            if leave is not None:
                leave(signum)
            previous(signum, frame)  # raises KeyboardInterrupt, or the command's Terminated
        return handler

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        if callable(previous):  # an ignored or default disposition stays as it is
            installed[signum] = previous
            signal.signal(signum, quiet(previous))
    try:
        yield
    except (KeyboardInterrupt, Terminated):
        _stop_threads([t for t in threading.enumerate() if t not in before])
        raise
    finally:
        for signum, previous in installed.items():
            signal.signal(signum, previous)


def _stop_threads(threads: list[threading.Thread], timeout: float = 2.0) -> None:
    """End the simulation's threads: SystemExit raised in each (it ends a thread quietly; one
    waiting inside ray.get ends only when Ray answers, so the command itself exits without
    waiting for them, see gradleak.commands.flower)."""
    for thread in threads:
        if thread.is_alive() and thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit))
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _load(reference: str, root: str):
    module_name, _, attr = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise GradleakError(f"Flower app '{root}': importing {module_name} failed: {type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise GradleakError(f"Flower app '{root}': {module_name} has no '{attr}'")
    return obj, module


def _find_audits(*modules) -> list[FlowerAudit]:
    found: dict[int, FlowerAudit] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, FlowerAudit):
                found[id(value)] = value
    if not found:
        raise GradleakError("Flower app has no gradleak.flower.FlowerAudit hook in its ServerApp or ClientApp "
                            "module (see docs/flower.md)")
    return list(found.values())


def _find_guards(*modules) -> list:
    """The app's client-side guards (`gradleak.flower.guard.FlowerGuard`), if it has any."""
    from .guard import FlowerGuard

    found = {id(v): v for module in modules for v in vars(module).values() if isinstance(v, FlowerGuard)}
    return list(found.values())


def _flatten(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _like(current: Any, value: Any, key: str) -> Any:
    """An override converted to the type of the app's own value."""
    if not isinstance(value, str):
        return value
    try:
        if isinstance(current, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError
            return value.lower() == "true"
        if isinstance(current, int):
            return int(value)
        if isinstance(current, float):
            return float(value)
    except ValueError:
        raise GradleakError(f"--run-config {key}={value}: expected a {type(current).__name__}") from None
    return value
