"""Where sweep cells run: in this process or in local worker processes (Ray:
gradleak.sweep.ray_executor). Executors only compute; the driver
(gradleak.sweep.run.run_sweep) writes every result to the store, so a store has
exactly one writer.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import GradleakError
from .cells import execute_cell
from .progress import SweepBars

_THROTTLE_SECONDS = 0.2


@dataclass(frozen=True)
class CellFailure:
    """A cell that raised: the sweep records it (one line) and goes on with the others."""
    error: str

    @classmethod
    def of(cls, exc: BaseException) -> "CellFailure":
        detail = str(exc) if isinstance(exc, GradleakError) else f"{type(exc).__name__}: {exc}"
        return cls(" ".join(detail.split()) or type(exc).__name__)


def single_thread() -> None:
    # Cells run side by side on few cores; one thread each also makes results
    # independent of the executor (same thread count → same floating point).
    import torch

    torch.set_num_threads(1)


class InProcessExecutor:
    def __init__(self, artifacts: Path | None = None):
        self.artifacts = artifacts

    def run(self, cells, bars: SweepBars):
        single_thread()
        for cell in cells:
            try:
                result = execute_cell(cell.kind, cell.spec, lambda i, t, d, c=cell: bars.attack(c, i, t, d),
                                      self.artifacts)
            except Exception as exc:
                result = CellFailure.of(exc)
            yield cell, result


# --- local worker processes

_progress_queue = None


def _init_worker(queue) -> None:
    global _progress_queue
    # Ctrl-C reaches the whole process group; the driver alone decides what happens
    # (it terminates the workers), so workers print nothing of their own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    single_thread()
    _progress_queue = queue


def _worker_cell(key: str, kind: str, spec: dict, artifacts: Path | None) -> dict:
    last = [0.0]

    def report(iteration: int, total: int, distance: float) -> None:
        now = time.monotonic()
        if _progress_queue is not None and (now - last[0] >= _THROTTLE_SECONDS or iteration >= total):
            last[0] = now
            _progress_queue.put((key, iteration, total, float(distance)))

    return execute_cell(kind, spec, report, artifacts)


class ProcessExecutor:
    def __init__(self, workers: int, artifacts: Path | None = None):
        self.workers = workers
        self.artifacts = artifacts

    def run(self, cells, bars: SweepBars):
        if not cells:
            return
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            # Workers fork from a server that already imported torch and the pipeline, and
            # torch._dynamo: the model-size check's meta-device forward imports it on first use
            # (about 1 s of every worker's first cell, and the demo starts a dozen workers).
            ctx.set_forkserver_preload(["torch", "torch._dynamo", "gradleak.run.experiment", "gradleak.sweep.cells"])
        queue = ctx.Queue()
        by_key = {c.key: c for c in cells}
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(cells)), mp_context=ctx,
                                   initializer=_init_worker, initargs=(queue,))
        completed = False
        try:
            # submit() starts the workers. A signal that lands while the forkserver is still
            # forking one would leave a child the pool does not know yet: the driver cannot stop
            # it, and it fails loudly reading semaphores the exiting driver removed.
            with _signals_held(signal.SIGINT, signal.SIGTERM):
                pending = {pool.submit(_worker_cell, c.key, c.kind, c.spec, self.artifacts): c for c in cells}
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
            completed = True
        finally:
            if not completed:  # interrupted (Ctrl-C, SIGTERM) or abandoned: stop the running cells now
                _terminate_workers(pool)
            # Wait even when interrupted (the workers are gone, so it is quick): a pool left to
            # close its pipes while the interpreter exits races CPython 3.11's exit hook, which
            # then prints a traceback after our one line.
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


@contextmanager
def _signals_held(*signums: int):
    """Hold these signals while the block runs; the first that arrived is delivered when it
    ends (to the handlers in place before, so Ctrl-C still interrupts, a moment later)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals in Python
        return
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, lambda received, _frame: arrived.append(received))
                for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if arrived:
            signal.raise_signal(arrived[0])


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    """Stop a pool's worker processes without waiting for their cells to finish."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
