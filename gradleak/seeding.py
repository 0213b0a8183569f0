"""Independent random streams derived from a run's seed and a path.

Every random draw of a scenario (which examples are targets, each client's
defense noise, the utility runs' sampling) takes its generator from `stream(seed,
*path)`: numpy's `SeedSequence` hashes the seed together with the path, so two
different paths give statistically independent streams for every seed (seed 0
included), and the same path always gives the same stream.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch


def stream_seed(seed: int, *path: str | int) -> int:
    """A 63-bit seed for the stream named by `path` under the run's `seed`."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    key = tuple(zlib.crc32(str(part).encode()) for part in path)
    state = np.random.SeedSequence(entropy=int(seed), spawn_key=key).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def stream(seed: int, *path: str | int) -> torch.Generator:
    """A CPU generator for the stream named by `path` (e.g. "client", "other", batch, k)."""
    return torch.Generator().manual_seed(stream_seed(seed, *path))
