"""`gradleak demo`: the main job on the embedded default (MNIST, LeNet)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..experiment import AttackRunSpec, run_attack, write_outputs

# The embedded default: a small leakage study that runs in a few minutes on 2 CPU cores.
DEFAULT_SCENARIOS = [
    AttackRunSpec(dataset="mnist", model="lenet", attack="ig:iterations=1500", batch_size=1, images=2),
    AttackRunSpec(dataset="mnist", model="lenet", attack="ig:iterations=1500", batch_size=1, images=2,
                  defenses=("noise:sigma=0.01",)),
    AttackRunSpec(dataset="mnist", model="lenet", attack="ig:iterations=1500", batch_size=1, images=2,
                  defenses=("clip:bound=0.1", "noise:sigma=0.001")),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="gradleak-demo", help="report directory")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    rows = []
    for i, spec in enumerate(DEFAULT_SCENARIOS):
        result = run_attack(spec)
        write_outputs(result, out / f"scenario-{i}")
        m = result.metrics
        rows.append({"attack": spec.attack, "defenses": list(spec.defenses), **m,
                     "seconds": result.seconds})
        print(f"{spec.attack:24s} {', '.join(spec.defenses) or 'none':32s} "
              f"PSNR {m['psnr']:.1f}  SSIM {m['ssim']:.3f}  LPIPS {m['lpips']:.3f}  ASR {m['asr']:.2f}")
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    print(f"report written to {out}/")
    return 0
