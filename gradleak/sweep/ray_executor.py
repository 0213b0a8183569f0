"""Sweep cells as Ray tasks on a running cluster (`--executor ray --address ...`)."""
from __future__ import annotations

import importlib.util
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import GradleakError
from .cells import execute_cell
from .executors import CellFailure, single_thread
from .progress import SweepBars

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


def _ray_cell(kind: str, spec: dict, artifacts: Path | None) -> dict:
    single_thread()

    return execute_cell(kind, spec, artifacts=artifacts)


class RayExecutor:
    """Cells as Ray tasks (one CPU each) on an existing cluster (`address`, e.g.
    '10.0.0.5:6379', 'auto' or 'ray://head:10001'); without an address Ray
    starts a local instance limited to `workers` CPUs.

    Ray itself keeps retrying an address where no cluster answers (minutes), so
    the address is checked first — its syntax at construction, the Ray Client
    extra for ray://, and a bounded gRPC greeting — and such failures are one
    GradleakError line within `connect_timeout` seconds. A gRPC server that is
    not a GCS still passes the check; Ray's own retries (~20 s) then fail it."""

    def __init__(self, address: str | None, workers: int, connect_timeout: float | None = None,
                 artifacts: Path | None = None):
        self.target = parse_ray_address(address)
        self.address = self.target.text
        self.workers = workers
        self.artifacts = artifacts
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
        # a folder on this machine: workers of a cluster without a shared file system train their own
        pending = {task.remote(c.kind, c.spec, self.artifacts): c for c in cells}
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
