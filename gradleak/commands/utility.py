"""`gradleak utility`: FedAvg on Dirichlet non-IID clients under a defense chain."""
from __future__ import annotations

import argparse
import json
import math
import sys

from ..errors import GradleakError
from ..options import MAX_BATCH, MAX_ITERATIONS, MAX_LR, ranged
from ..utility import DEFAULT_MODEL, UtilitySpec, run_utility
from .attack import add_bn_mode_argument, seed_type


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="mnist", help="dataset name (needs a train split)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model name[:key=value,...] (default {DEFAULT_MODEL}; plain 'lenet' is DLG's sigmoid LeNet)")
    p.add_argument("--defense", action="append", default=[], metavar="NAME[:key=value,...]",
                   help="defense to apply (repeat to chain, in order)")
    p.add_argument("--clients", type=ranged(int, 1, 100_000, "--clients"), default=100)
    p.add_argument("--per-round", type=ranged(int, 1, 100_000, "--per-round"), default=10,
                   help="clients drawn per round")
    p.add_argument("--rounds", type=ranged(int, 1, 100_000, "--rounds"), default=20)
    p.add_argument("--dirichlet", type=ranged(float, 1e-6, 1e6, "--dirichlet"), default=0.5,
                   help="α of the non-IID Dirichlet split")
    schedule = p.add_mutually_exclusive_group()  # steps or passes: both given, one would be ignored
    schedule.add_argument("--local-steps", type=ranged(int, 1, MAX_ITERATIONS, "--local-steps"), default=None,
                          help="local SGD steps (default: --local-epochs)")
    schedule.add_argument("--local-epochs", type=ranged(int, 1, 10_000, "--local-epochs"), default=1)
    p.add_argument("--local-batch-size", type=ranged(int, 1, MAX_BATCH, "--local-batch-size"), default=32)
    add_bn_mode_argument(p)
    p.add_argument("--lr", type=ranged(float, 0.0, MAX_LR, "--lr"), default=UtilitySpec.lr,
                   help="client learning rate")
    p.add_argument("--delta", type=ranged(float, 1e-100, 0.5, "--delta"), default=1e-5,
                   help="δ of the reported (ε, δ)")
    p.add_argument("--seed", type=seed_type, default=0)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def _refuse_unbounded_privacy(defenses: list[str], delta: float) -> None:
    """A DP defense without noise (e.g. dpsgd:sigma=0) spends an unbounded ε: say so before
    training rather than report ε = inf next to the accuracy."""
    from ..defenses import make_defense

    for text in defenses:
        epsilon = make_defense(text).privacy(sample_rate=1.0, steps=1, delta=delta)
        if epsilon is not None and not math.isfinite(epsilon):
            raise GradleakError(f"defense '{text}' gives no differential-privacy guarantee (ε is unbounded "
                                "without noise); use a noise multiplier sigma > 0, or clip:bound=... for "
                                "clipping alone")


def run(args: argparse.Namespace) -> int:
    _refuse_unbounded_privacy(args.defense, args.delta)
    spec = UtilitySpec(dataset=args.dataset, model=args.model, defenses=tuple(args.defense), clients=args.clients,
                       per_round=args.per_round, rounds=args.rounds, dirichlet=args.dirichlet,
                       local_steps=args.local_steps, local_epochs=args.local_epochs,
                       local_batch_size=args.local_batch_size, bn_mode=args.bn_mode, lr=args.lr, seed=args.seed,
                       delta=args.delta)
    if args.json:
        result = run_utility(spec)
        print(json.dumps(result.to_json()))
        return 0
    from tqdm import tqdm

    with tqdm(total=spec.rounds, desc="FedAvg rounds", file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        def progress(done: int, total: int, info: dict) -> None:
            bar.update(done - bar.n)
            bar.set_postfix(update_norm=f"{info['update_norm']:.3g}", refresh=False)

        result = run_utility(spec, progress)
    print(f"FedAvg {spec.dataset}/{spec.model}, {spec.rounds} rounds, {spec.per_round}/{spec.clients} clients, "
          f"Dirichlet {spec.dirichlet}, defenses: {', '.join(spec.defenses) or 'none'}")
    print(f"  train_loss     {result.train_loss:.4f}")
    print(f"  test_accuracy  {result.test_accuracy:.4f}")
    if result.epsilon is not None and math.isfinite(result.epsilon):
        print(f"  epsilon        {result.epsilon:.4g} (delta {spec.delta:g})")
    elif result.epsilon is not None:
        print("  epsilon        unbounded: no differential-privacy guarantee")
    print(f"  seconds        {result.seconds:.1f}")
    return 0
