"""`--executor ray`: a real Ray cluster runs a small sweep with the same results
as the local executor, and a bad address fails fast with one line (exit 2)."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gradleak.errors import GradleakError
from gradleak.sweep import parse_sweep
from gradleak.sweep.progress import SweepBars
from gradleak.sweep.ray_executor import RayExecutor, parse_ray_address

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
ENV.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))

# Cheap but real cells: an analytic attack under the malicious threat and a
# few iterations of Inverting Gradients, with and without a defense.
TINY_SWEEP = """
name: raytiny
defaults: {lpips: none}
grids:
  - datasets: [mnist]
    models: [lenet]
    batch_sizes: [1]
    seeds: [0]
    defenses: [none, noise:sigma=0.01]
    attacks:
      - {name: rtf, threat: malicious}
      - ig:iterations=10
"""


def gradleak(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradleak", *args], env=env or ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def stored(path: Path) -> dict[str, tuple[dict, list]]:
    with sqlite3.connect(path) as db:
        counts = dict(db.execute("SELECT key, COUNT(*) FROM cells GROUP BY key"))
        assert set(counts.values()) == {1}, "a cell was stored more than once"
        cells = {k: json.loads(m) for k, m in db.execute("SELECT key, metrics FROM cells")}
        images = {k: [] for k in cells}
        for key, idx, metrics in db.execute("SELECT cell_key, idx, metrics FROM images ORDER BY cell_key, idx"):
            images[key].append((idx, json.loads(metrics)))
    return {k: (cells[k], images[k]) for k in cells}


def assert_metrics_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, float):
            assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-9), name
        else:
            assert got[name] == value, name


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head limited to 2 CPUs, started (and stopped) by this test process;
    the CLI joins it by address like any driver joins a cluster."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    try:
        context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                           runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    except Exception as exc:  # Ray cannot start on this machine: nothing to test
        pytest.skip(f"Ray cannot start here: {type(exc).__name__}: {exc}")
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_ray_sweep_equals_local_run(tmp_path, ray_cluster):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(TINY_SWEEP)
    n_cells = len(parse_sweep(TINY_SWEEP).cells)
    assert n_cells == 4

    # A cluster that uses token authentication (RAY_AUTH_MODE, or a token in ~/.ray) is
    # sent the token by a driver given an explicit address only when asked to; a cluster
    # without one refuses a driver that insists on it.
    driver_env = dict(ENV)
    if os.environ.get("RAY_AUTH_MODE") or (Path.home() / ".ray" / "auth_token").exists():
        driver_env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "token")
    start = time.monotonic()
    on_ray = gradleak("sweep", str(spec), "--store", str(tmp_path / "ray.db"), "--executor", "ray",
                      "--address", ray_cluster, "--json", env=driver_env)
    ray_seconds = time.monotonic() - start
    assert on_ray.returncode == 0, on_ray.stderr[-2000:]
    summary = json.loads(on_ray.stdout)
    assert summary["executor"] == "ray" and summary["ran"] == summary["cells"] == n_cells

    local = gradleak("sweep", str(spec), "--store", str(tmp_path / "local.db"), "--workers", "1", "--json")
    assert local.returncode == 0, local.stderr[-2000:]

    ray_cells, local_cells = stored(tmp_path / "ray.db"), stored(tmp_path / "local.db")
    assert len(ray_cells) == n_cells and ray_cells.keys() == local_cells.keys()
    for key, (metrics, images) in local_cells.items():
        got_metrics, got_images = ray_cells[key]
        assert_metrics_close(got_metrics, metrics)
        assert [i for i, _ in got_images] == [i for i, _ in images]
        for (_, got), (_, want) in zip(got_images, images):
            assert_metrics_close(got, want)
    # The cells are real attacks: rtf recovers the image exactly without a defense.
    rtf_clean = [m for m, _ in local_cells.values() if m.get("psnr", 0) > 60]
    assert rtf_clean, "the analytic attack should reconstruct the undefended image"
    print(f"ray sweep: {ray_seconds:.1f} s for {n_cells} cells")


def _refused_address() -> str:
    with socket.socket() as sock:  # a port that was just free: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_bad_address_is_one_line_error_and_exit_2(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(TINY_SWEEP)
    start = time.monotonic()
    proc = gradleak("sweep", str(spec), "--store", str(tmp_path / "never.db"), "--executor", "ray",
                    "--address", _refused_address(), "--json", timeout=120)
    seconds = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert "cannot reach Ray" in line and "connection refused" in line
    assert seconds < 60  # was: Ray retrying for minutes
    # Nothing ran: no cell in the store.
    with sqlite3.connect(tmp_path / "never.db") as db:
        assert db.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 0


def _run_cells(address: str, connect_timeout: float = 30.0) -> None:
    cells = parse_sweep(TINY_SWEEP).cells[:1]
    for _ in RayExecutor(address, 1, connect_timeout=connect_timeout).run(cells, SweepBars(None, 1, 0)):
        pytest.fail("a cell ran although the address is bad")


@pytest.mark.parametrize("address, expected", [
    ("notanaddress", "expected host:port"),
    ("head:port", "expected host:port"),
    ("head:70000", "expected host:port"),
    ("http://head:8265", "unsupported scheme"),
])
def test_malformed_address_is_rejected_before_connecting(address, expected):
    with pytest.raises(GradleakError) as err:
        parse_ray_address(address)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_silent_server_times_out_within_the_connect_timeout():
    with socket.socket() as listener:  # the kernel accepts connections; nobody ever answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        start = time.monotonic()
        with pytest.raises(GradleakError) as err:
            _run_cells(f"127.0.0.1:{listener.getsockname()[1]}", connect_timeout=2.0)
        seconds = time.monotonic() - start
    message = str(err.value)
    assert "no gRPC handshake" in message and "GRADLEAK_RAY_CONNECT_TIMEOUT" in message and "\n" not in message
    # The 2 s connect timeout is honoured: not an instant refusal, not Ray's minutes of retries.
    # The upper end leaves room for a loaded machine; it is not a speed target.
    assert 1.5 < seconds < 30


def test_non_ray_server_is_rejected():
    with socket.socket() as listener:  # answers, but HTTP/1 (like the dashboard port)
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)

        def reply():
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=reply, daemon=True).start()
        with pytest.raises(GradleakError) as err:
            _run_cells(f"127.0.0.1:{listener.getsockname()[1]}", connect_timeout=5.0)
    assert "not Ray" in str(err.value) and "\n" not in str(err.value)


def test_client_address_without_client_extra():
    if importlib.util.find_spec("grpc") is not None:
        pytest.skip("the Ray Client extra is installed here")
    start = time.monotonic()
    with pytest.raises(GradleakError) as err:
        _run_cells("ray://127.0.0.1:10001")
    assert "ray[client]" in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - start < 5
