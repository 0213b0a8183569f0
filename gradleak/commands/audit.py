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
from .attack import add_scenario_arguments, training_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_scenario_arguments(p)
    p.add_argument("--attack", action="append", default=[], metavar="NAME[:key=value,...]",
                   help="attack to run (repeat for several; default: every attack the threat model and "
                        "the architecture allow)")
    p.add_argument("--budget", default="quick", choices=BUDGETS,
                   help="attack budget preset and how often an undecided attack's budget may double "
                        "(options given with --attack override the preset)")
    p.add_argument("--seeds", default=None, metavar="S[,S...]",
                   help="seeds to run, comma separated (default: --seed); a verdict of 'holds' needs two")
    p.add_argument("--gallery", default=None, metavar="DATASET",
                   help="more examples of your data's distribution that the client does not train on "
                        "(a folder of images or a tensor file), to re-identify reconstructions among")
    p.add_argument("--out", type=output_dir(), default="gradleak-audit",
                   help="report directory (index.html, results.db)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.add_argument("--tolerance", default=None, metavar="linkage=0.6,recognizable=0.1",
                   help="what you accept: 'holds' means every saturated attack's linkage AUC and recognizable "
                        "rate are bounded within it at 95%% (default linkage=0.6,recognizable=0.1)")


def run(args: argparse.Namespace) -> int:
    if args.pretrain_steps:
        raise GradleakError("gradleak audit: --pretrain-steps is not supported; pass trained weights with "
                            "--checkpoint")
    model = args.model
    if args.activation:
        model = f"{model}{',' if ':' in model else ':'}activation={args.activation}"
    gallery = None
    if args.gallery:
        from ..data import load_dataset
        from ..data.references import dataset_path_form, dataset_spec

        # a named text dataset's windows at the audited length; a file's examples as they are
        seq_len = args.seq_len if dataset_path_form(args.gallery) is None else None
        gallery = load_dataset(dataset_spec(args.gallery, args.split, args.resize, seq_len))
    result = audit(model, args.dataset, attacks=args.attack or "auto", defenses=args.defense,
                   threat=args.threat, knows=[k.strip() for k in args.knows.split(",") if k.strip()],
                   training=training_from_args(args), batch_size=args.batch_size,
                   images=args.images, seed=_seeds(args.seeds) if args.seeds else args.seed, budget=args.budget,
                   lpips=args.lpips, device=args.device, checkpoint=args.checkpoint, split=args.split,
                   resize=args.resize, seq_len=args.seq_len, gallery=gallery, progress=not args.json,
                   tolerance=args.tolerance)
    html = result.write_report(args.out)
    if args.json:
        print(json.dumps({**result.to_json(), "verdict": [e["verdict_text"] for e in result.verdicts()],
                          "html": str(html)}))
        return 0
    print(result.summary())
    print(f"report: {html}")
    return 0


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise GradleakError(f"--seeds '{text}': expected seeds, e.g. 0,1") from None
    if not seeds or min(seeds) < 0 or len(seeds) > 100:
        raise GradleakError(f"--seeds '{text}': 1 to 100 seeds, each >= 0")
    return seeds
