"""`gradleak bound`: the numeric lower bound (Eqs. 27–28) for a random two-layer network under a
defense, next to Table 1's closed-form lower and upper scalings and Prop. 2.1's DP noise."""
from __future__ import annotations

import argparse
import json
import math

from ..errors import GradleakError
from ..options import ranged
from ..theory.bounds import dp_noise_requirement, lower_bound
from ..theory.defenses import covered_defenses, parse_defense
from ..theory.model import ACTIVATIONS, random_data, random_network
from .attack import seed_type


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--d", type=ranged(int, 1, 100_000, "--d"), required=True, help="input dimension")
    p.add_argument("--m", type=ranged(int, 1, 1_000_000, "--m"), required=True, help="hidden width")
    p.add_argument("--batch-size", type=ranged(int, 1, 100_000, "--batch-size"), default=1)
    p.add_argument("--noise", type=ranged(float, 0.0, 1e6, "--noise"), required=True,
                   help="std σ of the observation noise")
    defense = p.add_argument("--defense", action="append", default=[],
                             help="NAME:k=v (repeatable; one report each): %(covered)s")
    defense.covered = _Covered()  # read when the help is shown: plugins' defenses included
    p.add_argument("--activation", default="square_cube", choices=list(ACTIVATIONS))
    p.add_argument("--seed", type=seed_type, default=0)
    p.add_argument("--epsilon", type=ranged(float, 1e-6, 1e6, "--epsilon"), default=1.0,
                   help="ε for Prop. 2.1's DP noise requirement")
    p.add_argument("--delta", type=ranged(float, 1e-100, 0.5, "--delta"), default=1e-5,
                   help="δ for Prop. 2.1's DP noise requirement")
    p.add_argument("--json", action="store_true")


class _Covered:
    """The defenses the two-layer analysis takes, listed only when the help is printed (listing
    them loads every registered defense)."""

    def __str__(self) -> str:
        return ", ".join(covered_defenses())


def run(args: argparse.Namespace) -> int:
    if args.d * args.m * (args.d + 1) * args.batch_size > 400_000_000:
        raise GradleakError("network too large for the Jacobian (keep B·d·m·(d+1) ≤ 4e8)")
    defenses = [parse_defense(text) for text in (args.defense or ["none"])]
    net = random_network(args.d, args.m, args.activation, seed=args.seed)
    x, y = random_data(args.d, args.batch_size, seed=args.seed)
    reports = [lower_bound(net, x, y, args.noise, defense).as_dict() for defense in defenses]
    dp = dp_noise_requirement(net, args.epsilon, args.delta).__dict__
    _check_finite({"bounds": reports, "dp_requirement": dp})
    if args.json:
        print(json.dumps({"bounds": reports, "dp_requirement": dp}, indent=2))
        return 0
    print(f"two-layer net d={args.d} m={args.m} B={args.batch_size} σ(z)={args.activation}, "
          f"observation noise σ={args.noise}")
    print(f"{'defense':28s} {'lower Eq.28':>12s} {'CRLB Eq.27':>12s} {'σ√(d/m) form':>13s} {'upper scaling':>14s}")
    for r in reports:
        crlb = f"{r['lower_crlb']:.4g}" if r["lower_crlb"] is not None else "n/a"
        upper = f"{r['upper_scaling']:.4g}" if r["upper_scaling"] is not None else "unknown"
        print(f"{r['defense']:28s} {r['lower_numeric']:12.4g} {crlb:>12s} {r['lower_closed_form']:13.4g} {upper:>14s}")
        if r["pruned_fraction_hat"] is not None:
            print(f"{'':28s} p̂ = {r['pruned_fraction_hat']:.4f} (pruning threshold d/(d+1) = "
                  f"{args.d / (args.d + 1):.4f})")
    print(f"Prop. 2.1: ({dp['epsilon']}, {dp['delta']})-DP needs σ ≥ {dp['sigma_required']:.4g} "
          f"(sensitivity Δ ≈ {dp['sensitivity']:.4g}, Δ²/m = {dp['sensitivity_sq_over_m']:.3g}); {dp['exponent_note']}")
    return 0


def _check_finite(value, where: str = "result") -> None:
    """Refuse to print NaN or infinity as a result: these settings lie outside what the bound covers."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, key)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_finite(item, where)
    elif isinstance(value, float) and not math.isfinite(value):
        raise GradleakError(f"the bound's '{where}' is not finite for these settings ({value}); "
                            "use a smaller network, a moderate noise, ε and δ")
