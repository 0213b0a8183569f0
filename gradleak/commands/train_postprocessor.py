"""`gradleak train-postprocessor`: train ROG's enhancement U-Net offline."""
from __future__ import annotations

import argparse
import time

from ..options import MAX_ITERATIONS, output_file, ranged
from .attack import seed_type


def add_arguments(p: argparse.ArgumentParser) -> None:
    # The default is a new file here, never the packaged weights (gradleak/assets/rog_unet.safetensors),
    # which only an explicit --out replaces.
    p.add_argument("--out", type=output_file(), default="rog_unet.safetensors",
                   help="safetensors file to write (default: ./rog_unet.safetensors)")
    p.add_argument("--steps", type=ranged(int, 1, MAX_ITERATIONS, "--steps"), default=1600,
                   help="training steps (batch 8 of 64 px crops); the shipped weights used 1600")
    p.add_argument("--seed", type=seed_type, default=0)


def run(args: argparse.Namespace) -> int:
    from ..postprocess.training import save_enhancer, train_enhancer

    start = time.perf_counter()

    def report(step: int, total: int, loss: float) -> None:
        if step % 100 == 0 or step == total:
            print(f"step {step}/{total}  L1 {loss:.4f}  {time.perf_counter() - start:.0f}s", flush=True)

    model = train_enhancer(steps=args.steps, seed=args.seed, progress=report)
    path = save_enhancer(model, args.out)
    print(f"weights written to {path}")
    return 0
