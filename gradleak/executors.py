"""Where sweep cells run: in this process, in local worker processes, or as Ray
tasks. Executors only compute; the driver (gradleak.sweep.run_sweep) writes
every result to the store, so a store has exactly one writer.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
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


def _cell_error(cell, exc: BaseException) -> GradleakError:
    what = cell.labels.get("attack_spec") or cell.kind
    defenses = ", ".join(cell.labels.get("defenses") or []) or "no defense"
    detail = str(exc) if isinstance(exc, GradleakError) else f"{type(exc).__name__}: {exc}"
    return GradleakError(f"cell {cell.key[:8]} ({what}, {defenses}, batch {cell.labels.get('batch_size')}) "
                         f"failed: {detail}")


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
                raise _cell_error(cell, exc) from exc
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
                        raise _cell_error(cell, exc) from exc
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

def _ray_cell(kind: str, spec: dict) -> dict:
    _single_thread()
    from .sweep import execute_cell

    return execute_cell(kind, spec)


class RayExecutor:
    """Cells as Ray tasks (one CPU each) on an existing cluster (`address`, e.g.
    'auto' or 'ray://head:10001'); without an address Ray starts a local one
    limited to `workers` CPUs."""

    def __init__(self, address: str | None, workers: int):
        self.address = address
        self.workers = workers

    def run(self, cells, bars: SweepBars):
        if not cells:
            return
        try:
            import ray  # lazy: only --executor ray pays for importing Ray
        except ImportError:
            raise GradleakError("--executor ray needs the 'ray' package (pip install ray)") from None
        init = {"ignore_reinit_error": True, "include_dashboard": False, "log_to_driver": False,
                "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}}}
        if self.address:
            init["address"] = self.address
        else:
            init["num_cpus"] = self.workers
        try:
            ray.init(**init)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise GradleakError(f"cannot connect to Ray at '{self.address or 'local'}': "
                                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
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
                        raise _cell_error(cell, getattr(exc, "cause", None) or exc) from exc
                    yield cell, result
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if not self.address:
                ray.shutdown()
