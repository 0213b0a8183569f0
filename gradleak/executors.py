"""Where sweep cells run: in this process, in local worker processes, or as Ray
tasks. Executors only compute; the driver (gradleak.sweep.run_sweep) writes
every result to the store, so a store has exactly one writer.
"""
from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Iterator

from .errors import GradleakError

_THROTTLE_SECONDS = 0.2


class SweepBars:
    """Live bars on stderr: the sweep, and one per running attack (iteration and
    update distance). A disabled instance does nothing (--json)."""

    def __init__(self, progress, total: int, already: int):
        self._progress = progress
        self._attacks: dict[str, int] = {}
        if progress is not None:
            self._sweep = progress.add_task("sweep", total=total, completed=already, info=f"{already} cached")

    def attack(self, cell, iteration: int, total: int, distance: float) -> None:
        if self._progress is None:
            return
        task = self._attacks.get(cell.key)
        label = f"{cell.labels.get('attack', cell.kind)} · {cell.labels.get('defense')} {cell.labels.get('strength')}"
        if task is None:
            task = self._attacks[cell.key] = self._progress.add_task(label[:48], total=total, info="")
        self._progress.update(task, completed=iteration, total=total, info=f"distance {distance:.3g}")

    def cell_done(self, cell) -> None:
        if self._progress is None:
            return
        task = self._attacks.pop(cell.key, None)
        if task is not None:
            self._progress.remove_task(task)
        self._progress.advance(self._sweep)


@contextlib.contextmanager
def sweep_progress(total: int, already: int, enabled: bool = True) -> Iterator[SweepBars]:
    if not enabled:
        yield SweepBars(None, total, already)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    with progress:
        yield SweepBars(progress, total, already)


def make_executor(name: str, workers: int, address: str | None = None):
    if name == "local":
        return InProcessExecutor() if workers == 1 else ProcessExecutor(workers)
    if name == "ray":
        return RayExecutor(address, workers)
    raise GradleakError(f"--executor must be local or ray, got '{name}'")


@dataclass(frozen=True)
class CellFailure:
    """A cell that raised: the sweep records it (one line) and goes on with the others."""
    error: str

    @classmethod
    def of(cls, exc: BaseException) -> "CellFailure":
        detail = str(exc) if isinstance(exc, GradleakError) else f"{type(exc).__name__}: {exc}"
        return cls(" ".join(detail.split()) or type(exc).__name__)


def _single_thread() -> None:
    # Cells run side by side on few cores; one thread each also makes results
    # independent of the executor (same thread count → same floating point).
    import torch

    torch.set_num_threads(1)


class InProcessExecutor:
    def run(self, cells, bars: SweepBars):
        from .sweep import execute_cell

        _single_thread()
        for cell in cells:
            try:
                result = execute_cell(cell.kind, cell.spec, lambda i, t, d, c=cell: bars.attack(c, i, t, d))
            except Exception as exc:
                result = CellFailure.of(exc)
            yield cell, result


# --- local worker processes

_progress_queue = None


def _init_worker(queue) -> None:
    global _progress_queue
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _single_thread()
    _progress_queue = queue


def _worker_cell(key: str, kind: str, spec: dict) -> dict:
    from .sweep import execute_cell

    last = [0.0]

    def report(iteration: int, total: int, distance: float) -> None:
        now = time.monotonic()
        if _progress_queue is not None and (now - last[0] >= _THROTTLE_SECONDS or iteration >= total):
            last[0] = now
            _progress_queue.put((key, iteration, total, float(distance)))

    return execute_cell(kind, spec, report)


class ProcessExecutor:
    def __init__(self, workers: int):
        self.workers = workers

    def run(self, cells, bars: SweepBars):
        if not cells:
            return
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            # Workers fork from a server that already imported torch and the pipeline.
            ctx.set_forkserver_preload(["torch", "gradleak.experiment", "gradleak.sweep"])
        queue = ctx.Queue()
        by_key = {c.key: c for c in cells}
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(cells)), mp_context=ctx,
                                   initializer=_init_worker, initargs=(queue,))
        try:
            pending = {pool.submit(_worker_cell, c.key, c.kind, c.spec): c for c in cells}
            while pending:
                finished, _ = wait(pending, timeout=_THROTTLE_SECONDS, return_when=FIRST_COMPLETED)
                self._drain(queue, by_key, bars)
                for future in finished:
                    cell = pending.pop(future)
                    try:
                        result = future.result()
                    except Exception as exc:
                        result = CellFailure.of(exc)
                    yield cell, result
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            queue.close()

    @staticmethod
    def _drain(queue, by_key, bars: SweepBars) -> None:
        import queue as queue_module

        while True:
            try:
                key, iteration, total, distance = queue.get_nowait()
            except (queue_module.Empty, OSError, EOFError):
                return
            if key in by_key:
                bars.attack(by_key[key], iteration, total, distance)


# --- Ray

RAY_CONNECT_TIMEOUT_ENV = "GRADLEAK_RAY_CONNECT_TIMEOUT"
DEFAULT_RAY_CONNECT_TIMEOUT = 30.0
_ADDRESS_FORMS = "expected host:port of the cluster's GCS (e.g. 10.0.0.5:6379), ray://host:port (Ray Client) or auto"
# HTTP/2 client connection preface + an empty SETTINGS frame. Ray's GCS and its
# Client server are gRPC servers, which answer with a SETTINGS frame at once.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_SETTINGS = 0x04


@dataclass(frozen=True)
class RayAddress:
    """Where to run Ray tasks: `host:port` of a running cluster's GCS, a Ray
    Client `ray://host:port`, `auto` (the cluster on this machine), or None for
    a new local instance."""

    text: str | None
    host: str | None = None
    port: int | None = None
    client: bool = False
    source: str = "--address"  # or RAY_ADDRESS: named in errors

    @property
    def local(self) -> bool:
        return self.text is None


def parse_ray_address(address: str | None) -> RayAddress:
    """Validate `address` without touching the network. As in `ray.init`,
    RAY_ADDRESS stands in for a missing address or `auto`."""
    source = "--address"
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and address in (None, "auto"):
        address, source = env, "RAY_ADDRESS"
    if address is None or address == "local":
        return RayAddress(None)
    text = address.strip()
    if text == "auto":
        return RayAddress("auto", source=source)
    scheme, sep, rest = text.partition("://")
    if sep and scheme != "ray":
        raise GradleakError(f"{source} '{address}': unsupported scheme '{scheme}://'; {_ADDRESS_FORMS}")
    host, port = _split_host_port(rest if sep else text)
    if host is None:
        raise GradleakError(f"{source} '{address}': {_ADDRESS_FORMS}")
    return RayAddress(text, host, port, client=bool(sep), source=source)


def _split_host_port(text: str) -> tuple[str | None, int | None]:
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):  # [IPv6]:port
        host = host[1:-1]
    if not sep or not host or any(c in host for c in "/ ?#@") or not port.isdigit() or not 0 < int(port) < 65536:
        return None, None
    return host, int(port)


def ray_connect_timeout() -> float:
    """Seconds allowed to reach a Ray cluster (GRADLEAK_RAY_CONNECT_TIMEOUT, default 30)."""
    raw = os.environ.get(RAY_CONNECT_TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_RAY_CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise GradleakError(f"{RAY_CONNECT_TIMEOUT_ENV} must be a positive number of seconds, got '{raw}'")
    return value


@dataclass(frozen=True)
class ProbeFailure:
    reason: str
    timed_out: bool = False


def probe_grpc_server(host: str, port: int, timeout: float, tls: bool = False) -> ProbeFailure | None:
    """None if a gRPC server answers at host:port within `timeout` seconds,
    else why not. Bounded in every case (name lookup included), so a wrong
    address fails fast instead of leaving Ray to retry for minutes."""
    outcome: list[ProbeFailure | None] = []

    def attempt() -> None:
        deadline = time.monotonic() + timeout
        connected = False
        try:
            with socket.create_connection((host, port), timeout=timeout) as sock:
                connected = True
                if tls:  # the TLS handshake is Ray's business; reaching the port is all we check
                    outcome.append(None)
                    return
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.sendall(_HTTP2_HELLO)
                reply = sock.recv(9)
        except socket.gaierror:
            outcome.append(ProbeFailure(f"unknown host '{host}'"))
        except ConnectionRefusedError:
            outcome.append(ProbeFailure("connection refused (nothing listens on that port)"))
        except (socket.timeout, TimeoutError):
            outcome.append(ProbeFailure("the port accepts connections but sent no gRPC handshake" if connected
                                        else f"no answer within {timeout:g} s", timed_out=True))
        except OSError as exc:
            outcome.append(ProbeFailure(exc.strerror or type(exc).__name__))
        else:
            grpc = len(reply) >= 4 and reply[3] == _HTTP2_SETTINGS
            outcome.append(None if grpc else ProbeFailure("a server answers but it is not Ray (no gRPC handshake); "
                                                          "the GCS port is usually 6379, the Ray Client port 10001"))

    # A thread bounds the DNS lookup too, which ignores socket timeouts.
    thread = threading.Thread(target=attempt, name="gradleak-ray-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return outcome[0] if outcome else ProbeFailure(f"no answer within {timeout:g} s", timed_out=True)


def _ray_cell(kind: str, spec: dict) -> dict:
    _single_thread()
    from .sweep import execute_cell

    return execute_cell(kind, spec)


class RayExecutor:
    """Cells as Ray tasks (one CPU each) on an existing cluster (`address`, e.g.
    '10.0.0.5:6379', 'auto' or 'ray://head:10001'); without an address Ray
    starts a local instance limited to `workers` CPUs.

    Ray itself keeps retrying an address where no cluster answers (minutes), so
    the address is checked first — its syntax at construction, the Ray Client
    extra for ray://, and a bounded gRPC greeting — and such failures are one
    GradleakError line within `connect_timeout` seconds. A gRPC server that is
    not a GCS still passes the check; Ray's own retries (~20 s) then fail it."""

    def __init__(self, address: str | None, workers: int, connect_timeout: float | None = None):
        self.target = parse_ray_address(address)
        self.address = self.target.text
        self.workers = workers
        self.connect_timeout = ray_connect_timeout() if connect_timeout is None else connect_timeout
        if not self.connect_timeout > 0:
            raise GradleakError(f"the Ray connect timeout must be > 0 seconds, got {self.connect_timeout}")

    def run(self, cells, bars: SweepBars):
        if not cells:
            return
        self._check_reachable()
        try:
            import ray  # lazy: only --executor ray pays for importing Ray
        except ImportError:
            raise GradleakError("--executor ray needs the 'ray' package (pip install ray)") from None
        owns_ray = not ray.is_initialized()  # a caller's own Ray session is used as is, and left open
        if owns_ray:
            self._init(ray)
        task = ray.remote(num_cpus=1)(_ray_cell)
        pending = {task.remote(c.kind, c.spec): c for c in cells}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    cell = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as exc:
                        result = CellFailure.of(getattr(exc, "cause", None) or exc)
                    yield cell, result
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if owns_ray:  # stops a local instance; for a cluster, disconnects this driver only
                ray.shutdown()

    def _where(self) -> str:
        return f"Ray at {self.target.source} '{self.target.text}'"

    def _check_reachable(self) -> None:
        target = self.target
        if target.local:
            return
        if target.client and importlib.util.find_spec("grpc") is None:
            raise GradleakError(f"{self._where()}: a ray:// address needs the Ray Client extra "
                                f"(pip install 'ray[client]'); or give the GCS address host:6379 instead")
        host, port = target.host, target.port
        if target.text == "auto":
            host, port = self._resolve_auto()
            if host is None:
                return
        tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
        failure = probe_grpc_server(host, port, self.connect_timeout, tls=tls)
        if failure is not None:
            hint = f" (wait longer with {RAY_CONNECT_TIMEOUT_ENV}=SECONDS)" if failure.timed_out else ""
            raise GradleakError(f"cannot reach {self._where()}: {failure.reason}{hint}")

    def _resolve_auto(self) -> tuple[str | None, int | None]:
        """The cluster `auto` means, found as ray.init finds it (Ray's own lookup:
        the last `ray start` on this machine, else a running GCS)."""
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:  # internal API moved: leave the lookup to ray.init
            return None, None
        try:
            resolved = canonicalize_bootstrap_address("auto")
        except ConnectionError:
            raise GradleakError(f"{self._where()}: no running Ray cluster found on this machine "
                                f"(start one with `ray start --head`, or give its address)") from None
        return _split_host_port(resolved) if resolved else (None, None)

    def _init(self, ray) -> None:
        init = {"include_dashboard": False, "log_to_driver": False,
                "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}}}
        if self.target.local:
            init.update(address="local", num_cpus=self.workers)
        else:
            init["address"] = self.target.text
        try:
            ray.init(**init)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            what = "start a local Ray instance" if self.target.local else f"connect to {self._where()}"
            raise GradleakError(f"cannot {what}: {first}{_auth_hint(exc)}") from None


def _auth_hint(exc: BaseException) -> str:
    """Ray turns token authentication on for new clusters but, given an explicit
    address, a driver only sends a token when told to: say so."""
    while exc is not None:
        if "InvalidAuthToken" in str(exc) or "Unauthenticated" in str(exc):
            return ("; the cluster requires token authentication: set RAY_AUTH_MODE=token and the cluster's "
                    "token (RAY_AUTH_TOKEN or ~/.ray/auth_token)")
        exc = exc.__cause__ or exc.__context__
    return ""
