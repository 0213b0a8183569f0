"""`gradleak audit`: every applicable attack on your model and data, one report.

    gradleak audit --model my_model.py:Net --checkpoint weights.pt \\
        --dataset image-folder:path=client_images/ --batch-size 4 --out audit/
"""
from __future__ import annotations

import argparse
import json

from ..api import BUDGETS, audit
from ..errors import GradleakError
from ..options import output_dir
from .attack import add_scenario_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_scenario_arguments(p)
    p.add_argument("--attack", action="append", default=[], metavar="NAME[:key=value,...]",
                   help="attack to run (repeat for several; default: every attack the threat model and "
                        "the architecture allow)")
    p.add_argument("--budget", default="quick", choices=BUDGETS,
                   help="attack budget preset (options given with --attack override it)")
    p.add_argument("--out", type=output_dir(), default="gradleak-audit",
                   help="report directory (index.html, results.db)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    if args.pretrain_steps:
        raise GradleakError("gradleak audit: --pretrain-steps is not supported; pass trained weights with "
                            "--checkpoint")
    model = args.model
    if args.activation:
        model = f"{model}{',' if ':' in model else ':'}activation={args.activation}"
    result = audit(model, args.dataset, attacks=args.attack or "auto", defenses=args.defense,
                   threat=args.threat, knows=[k.strip() for k in args.knows.split(",") if k.strip()],
                   lr=args.lr, local_steps=args.local_steps, local_epochs=args.local_epochs,
                   local_batch_size=args.local_batch_size, bn_mode=args.bn_mode, batch_size=args.batch_size,
                   images=args.images, seed=args.seed, budget=args.budget, lpips=args.lpips,
                   device=args.device, checkpoint=args.checkpoint, split=args.split, resize=args.resize,
                   progress=not args.json)
    html = result.write_report(args.out)
    if args.json:
        print(json.dumps({**result.to_json(), "html": str(html)}))
        return 0
    print(f"audit of {result.setting['model']} on {result.setting['dataset']}, batch {args.batch_size}, "
          f"threat {result.setting['threat']}, defenses: {', '.join(args.defense) or 'none'}")
    fmt = lambda v: "–" if v is None else f"{v:.3g}"  # noqa: E731
    print(f"  {'attack':40s} {'MSE':>8s} {'PSNR':>6s} {'SSIM':>6s} {'LPIPS':>6s} {'ASR':>5s} {'s':>6s}")
    for run_ in sorted(result.runs, key=lambda r: r.metrics.get("mse") or float("inf")):
        m = run_.metrics
        print(f"  {run_.spec.attack[:40]:40s} {fmt(m.get('mse')):>8s} {fmt(m.get('psnr')):>6s} "
              f"{fmt(m.get('ssim')):>6s} {fmt(m.get('lpips')):>6s} {fmt(m.get('asr')):>5s} {run_.seconds:6.1f}")
    for skip in result.skipped:
        print(f"  not run: {skip.attack}: {skip.reason}")
    print(f"report: {html}")
    return 0
