"""`gradleak utility`: FedAvg on Dirichlet non-IID clients under a defense chain."""
from __future__ import annotations

import argparse
import json
import sys

from ..utility import DEFAULT_MODEL, UtilitySpec, run_utility
from .attack import add_bn_mode_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="mnist", help="dataset name (needs a train split)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model name[:key=value,...] (default {DEFAULT_MODEL}; plain 'lenet' is DLG's sigmoid LeNet)")
    p.add_argument("--defense", action="append", default=[], metavar="NAME[:key=value,...]",
                   help="defense to apply (repeat to chain, in order)")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10, help="clients drawn per round")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--dirichlet", type=float, default=0.5, help="α of the non-IID Dirichlet split")
    p.add_argument("--local-steps", type=int, default=None, help="local SGD steps (default: --local-epochs)")
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--local-batch-size", type=int, default=32)
    add_bn_mode_argument(p)
    p.add_argument("--lr", type=float, default=UtilitySpec.lr, help="client learning rate")
    p.add_argument("--delta", type=float, default=1e-5, help="δ of the reported (ε, δ)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    spec = UtilitySpec(dataset=args.dataset, model=args.model, defenses=tuple(args.defense), clients=args.clients,
                       per_round=args.per_round, rounds=args.rounds, dirichlet=args.dirichlet,
                       local_steps=args.local_steps, local_epochs=args.local_epochs,
                       local_batch_size=args.local_batch_size, bn_mode=args.bn_mode, lr=args.lr, seed=args.seed, delta=args.delta)
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
    if result.epsilon is not None:
        print(f"  epsilon        {result.epsilon:.4g} (delta {spec.delta:g})")
    print(f"  seconds        {result.seconds:.1f}")
    return 0
