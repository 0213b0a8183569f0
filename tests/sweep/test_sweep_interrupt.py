"""Ctrl-C (SIGINT) or SIGTERM to a sweep running on worker processes: one line on
stderr, exit code 130 / 143 within seconds, no process left behind, the store
consistent, and the same command finishes the sweep."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.process_groups import as_in_a_terminal, group_ends, kill_group

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

# Six cells of a few seconds each: an interrupt lands while cells are running.
SWEEP = """
name: interrupt
defaults: {lpips: none}
grids:
  - datasets: [mnist]
    models: [lenet]
    batch_sizes: [1]
    seeds: [0, 1, 2]
    defenses: [none]
    attacks: [ig:iterations=400, dlg:iterations=40]
"""


def _stored(store: Path) -> int:
    try:
        with sqlite3.connect(store, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    except sqlite3.OperationalError:
        return 0  # not created yet


@pytest.mark.slow
@pytest.mark.parametrize("signum,code,word", [(signal.SIGINT, 130, "interrupted"),
                                              (signal.SIGTERM, 143, "terminated")])
def test_signal_stops_the_sweep_cleanly_and_resume_finishes_it(tmp_path, signum, code, word):
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    store = tmp_path / "r.db"
    command = [sys.executable, "-m", "gradleak", "sweep", str(tmp_path / "sweep.yaml"), "--store", str(store),
               "--workers", "2", "--json"]
    proc = subprocess.Popen(command, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=as_in_a_terminal)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and _stored(store) < 1:
            time.sleep(0.1)
        assert proc.poll() is None, "the sweep ended before it could be interrupted"
        proc.send_signal(signum)  # the driver only, as `timeout -s INT` or a service manager does
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0] and "Traceback" not in err, err
    assert group_ends(proc.pid), "worker or forkserver processes outlived the sweep"

    partial = _stored(store)
    assert 1 <= partial < 6
    resumed = subprocess.run(command, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["skipped"] == partial and summary["ran"] == 6 - partial


def test_interrupt_does_not_wait_for_running_cells(tmp_path):
    # Two cells of many minutes each: the driver must stop its workers, not wait them out.
    (tmp_path / "sweep.yaml").write_text(SWEEP.replace("seeds: [0, 1, 2]", "seeds: [0]")
                                         .replace("ig:iterations=400, dlg:iterations=40",
                                                  "ig:iterations=100000, cpl:iterations=100000"))
    proc = subprocess.Popen([sys.executable, "-m", "gradleak", "sweep", str(tmp_path / "sweep.yaml"),
                             "--store", str(tmp_path / "r.db"), "--workers", "2", "--json"],
                            env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=as_in_a_terminal)
    try:
        time.sleep(8)  # both workers are inside their cells
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        _, err = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - start
    finally:
        kill_group(proc)
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1, err
    assert stopped_after < 20, f"the driver took {stopped_after:.0f} s to stop"
    assert group_ends(proc.pid), "worker or forkserver processes outlived the sweep"


# The driver is interrupted while the pool is still starting its workers (the forkserver
# preloads torch for a second or more): the signal is held until every worker the pool
# started is known, so the driver stops them all and none is left to fail on its own.
EARLY_INTERRUPT = """
import os, signal, sys, threading
from types import SimpleNamespace
from gradleak.sweep.executors import ProcessExecutor
from gradleak.sweep.progress import SweepBars

cells = [SimpleNamespace(key=str(i), kind="attack", spec={}, labels={}) for i in range(4)]
threading.Timer(float(sys.argv[1]), os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    for _ in ProcessExecutor(2).run(cells, SweepBars(None, len(cells), 0)):
        pass
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.parametrize("delay", [0.05, 0.3])
def test_interrupt_while_workers_start_leaves_no_stray_worker(delay):
    proc = subprocess.Popen([sys.executable, "-c", EARLY_INTERRUPT, str(delay)], env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=as_in_a_terminal)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert out.strip() == "interrupted" and err.strip() == "", err
    assert group_ends(proc.pid), "a worker or the forkserver outlived the driver"
