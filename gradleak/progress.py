"""Progress bars on stderr (silent when output is piped as JSON)."""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def attack_progress(label: str) -> Iterator[Callable[[int, int, float], None]]:
    """A tqdm bar showing the attack's iteration and current update distance."""
    from tqdm import tqdm

    bar = None

    def update(iteration: int, total: int, objective: float) -> None:
        nonlocal bar
        if bar is None or bar.total != total or iteration < bar.n:
            if bar is not None:
                bar.close()
            bar = tqdm(total=total, desc=label, file=sys.stderr, leave=False, dynamic_ncols=True)
        bar.update(iteration - bar.n)
        bar.set_postfix(distance=f"{objective:.3g}", refresh=False)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()
