"""`gradleak train-postprocessor`: train ROG's enhancement U-Net offline."""
from __future__ import annotations

import argparse
import time

from ..errors import GradleakError
from ..postprocess.unet import DEFAULT_WEIGHTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="safetensors file to write")
    p.add_argument("--steps", type=int, default=1600, help="training steps (batch 8 of 64 px crops); the shipped weights used 1600")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from ..postprocess.training import save_enhancer, train_enhancer

    if args.steps < 1:
        raise GradleakError(f"--steps must be >= 1, got {args.steps}")
    start = time.perf_counter()

    def report(step: int, total: int, loss: float) -> None:
        if step % 100 == 0 or step == total:
            print(f"step {step}/{total}  L1 {loss:.4f}  {time.perf_counter() - start:.0f}s", flush=True)

    model = train_enhancer(steps=args.steps, seed=args.seed, progress=report)
    path = save_enhancer(model, args.out)
    print(f"weights written to {path}")
    return 0
