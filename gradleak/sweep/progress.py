"""Live progress bars of a sweep on stderr (rich)."""
from __future__ import annotations

import contextlib
from typing import Iterator


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
