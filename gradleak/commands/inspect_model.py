"""`gradleak inspect-model`: the checks a careful client runs on a received model,
for the model a malicious attack sends vs an honest one of the same architecture."""
from __future__ import annotations

import argparse
import json

import torch

from ..attacks import make_attack
from ..attacks.base import AttackContext
from ..data import load_dataset
from ..data.references import dataset_spec
from ..errors import GradleakError
from ..inspect import format_report, inspect_model
from ..options import MAX_BATCH, MAX_IMAGE_SIDE, MIN_IMAGE_SIDE, ranged
from ..run.experiment import AttackRunSpec, build_scenario_model
from .attack import seed_type


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="dataset name[:resize=N,...]")
    p.add_argument("--model", required=True, help="model name[:key=value,...]")
    p.add_argument("--attack", required=True, help="malicious attack name[:key=value,...]")
    p.add_argument("--batch-size", type=ranged(int, 1, MAX_BATCH, "--batch-size"), default=16,
                   help="real samples for the gradient checks")
    p.add_argument("--resize", type=ranged(int, MIN_IMAGE_SIDE, MAX_IMAGE_SIDE, "--resize"), default=None,
                   help="resize images to N×N")
    p.add_argument("--seed", type=seed_type, default=0)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def inspect_attack(dataset: str, model: str, attack: str, batch_size: int = 16,
                   resize: int | None = None, seed: int = 0) -> dict:
    """Build the honest model, let `attack` prepare its malicious version, compare both."""
    if batch_size < 1:
        raise GradleakError(f"--batch-size must be >= 1, got {batch_size}")
    attack_obj = make_attack(attack)
    if not attack_obj.malicious:
        raise GradleakError(f"attack '{attack_obj.name}' is not a malicious-server attack; "
                            "inspect-model compares the model such an attack sends")
    data = load_dataset(dataset_spec(dataset, "test", resize))
    spec = AttackRunSpec(dataset=dataset, model=model, attack=attack, seed=seed, threat="malicious")
    received = build_scenario_model(spec, data.signature)
    received = attack_obj.prepare_model(received, data.input_shape, data.num_classes,
                                        AttackContext(seed=seed)).model
    honest = build_scenario_model(AttackRunSpec(dataset=dataset, model=model, attack=attack,
                                                seed=seed + 1), data.signature)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:batch_size]
    report = inspect_model(received, honest, data.inputs[order], data.labels[order])
    out = report.to_dict()
    out.update(attack=attack, model=model, dataset=dataset)
    out["text"] = format_report(report, f"{attack} on {dataset}/{model}")
    return out


def run(args: argparse.Namespace) -> int:
    result = inspect_attack(args.dataset, args.model, args.attack, args.batch_size, args.resize, args.seed)
    text = result.pop("text")
    if args.json:
        print(json.dumps(result))
    else:
        print(text)
    return 0
