"""`gradleak attack`: one scenario, scored, optionally written to --out."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..fl.training import AUGMENTATIONS, BN_MODES, SHUFFLE_MODES, TrainingSpec, scenario_fields, training_from_scenario
from ..modalities import modality
from ..options import RUN_SPEC_BOUNDS, device_name, output_dir, ranged
from ..run.experiment import AttackRunSpec, run_attack, training_fields, write_outputs
from ..threat import KNOWLEDGE, PRESETS


def run_flag(field: str, kind: type = int):
    """The argparse type of the flag for an AttackRunSpec field, within that field's bounds."""
    low, high = RUN_SPEC_BOUNDS[field]
    return ranged(kind, low, high, "--" + field.replace("_", "-"))


seed_type = run_flag("seed")


def augmentations(text: str) -> tuple[str, ...]:
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in names if a not in AUGMENTATIONS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown augmentation '{unknown[0]}'; choose from: {', '.join(AUGMENTATIONS)}")
    return names


def add_training_arguments(p: argparse.ArgumentParser, local_steps_default: int | None = 1,
                           local_epochs_default: int | None = None, local_batch_default: int | None = None,
                           lr_default: float = 0.1) -> None:
    """The client's local training: steps, epochs, batch size, batch norm mode, learning rate."""
    # a client trains a number of steps or of passes over its data: both given, one would be ignored
    schedule = p.add_mutually_exclusive_group()
    schedule.add_argument("--local-steps", type=run_flag("local_steps"), default=local_steps_default,
                          help="local SGD steps (1 = FedSGD gradient)")
    schedule.add_argument("--local-epochs", type=run_flag("local_epochs"),
                          default=local_epochs_default)
    p.add_argument("--local-batch-size", type=run_flag("local_batch_size"),
                   default=local_batch_default)
    add_bn_mode_argument(p)
    p.add_argument("--lr", type=run_flag("lr", float), default=lr_default, help="client learning rate")
    p.add_argument("--shuffle-seed", type=run_flag("shuffle_seed"), default=None, metavar="SEED",
                   help="the client shuffles its mini-batches as DataLoader(shuffle=True) with a generator "
                        "seeded SEED, which the server knows (default: mini-batches in order)")
    p.add_argument("--shuffle", default=None, choices=SHUFFLE_MODES,
                   help="the client's batch order each epoch: none (in order), known (a shuffle seeded "
                        "--shuffle-seed) or unknown (a shuffle the server cannot replay; attack with fedavg)")
    p.add_argument("--augment", type=augmentations, default=(), metavar="crop,flip",
                   help="the client's data augmentation: random crop of the zero-padded image "
                        "(--crop-padding), horizontal flip; the server knows which, never the draws")
    p.add_argument("--crop-padding", type=run_flag("crop_padding"), default=4)
    p.add_argument("--label-smoothing", type=run_flag("label_smoothing", float), default=0.0)
    p.add_argument("--clip-norm", type=run_flag("clip_norm", float), default=None,
                   help="the client clips each step's gradient to this L2 norm (clip_grad_norm_)")
    p.add_argument("--sends-buffers", action="store_true",
                   help="the client sends its buffers (batch-norm running statistics) with its update, as a "
                        "Flower client returning its state dict does; after one local step on the whole batch "
                        "they give the server the batch's BN statistics")
    p.add_argument("--lora", type=int, default=None, metavar="RANK",
                   help="the client fine-tunes LoRA adapters of this rank on the attention Q/K/V projections, "
                        "the base weights frozen, and sends only the adapters (attack with dager)")
    p.add_argument("--lora-alpha", type=float, default=None, metavar="ALPHA",
                   help="the adapters' alpha (their scaling is alpha / rank; default: the rank)")
    p.add_argument("--lora-b-std", type=float, default=0.0, metavar="STD",
                   help="draw the adapters' B Gaussian with this deviation instead of zero (adapters part-way "
                        "through a fine-tuning)")
    p.add_argument("--optimizer", default="sgd", metavar="NAME[:key=value,...]",
                   help="the client's optimizer, replayed as torch.optim runs it: sgd (momentum, dampening, "
                        "nesterov, weight_decay), adam or adamw (beta1, beta2, eps, weight_decay); default plain sgd")


def add_bn_mode_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bn-mode", default="train", choices=BN_MODES,
                   help="batch norm in local training: batch statistics (train) or running statistics (eval)")


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="dataset name[:path=DIR,resize=N,crop=N]")
    p.add_argument("--model", required=True, help="model name[:key=value,...]")
    p.add_argument("--batch-size", type=run_flag("batch_size"), default=1)
    p.add_argument("--defense", action="append", default=[], metavar="NAME[:key=value,...]",
                   help="defense to apply (repeat to chain, in order)")
    add_training_arguments(p)
    p.add_argument("--images", type=run_flag("images"), default=None,
                   help="images to attack, whole batches of --batch-size (default: one batch)")
    p.add_argument("--seed", type=seed_type, default=0)
    p.add_argument("--seq-len", type=run_flag("seq_len"), default=None,
                   help="tokens per sequence of a text dataset (default: news 16, polarity 32)")
    p.add_argument("--threat", default="honest", choices=list(PRESETS))
    p.add_argument("--knows", default="", help=f"extra knowledge, comma separated: {', '.join(KNOWLEDGE)}")
    p.add_argument("--activation", default=None, choices=["relu", "sigmoid", "tanh", "leakyrelu"])
    p.add_argument("--pretrain-steps", type=run_flag("pretrain_steps"), default=0,
                   help="SGD steps on the train split first")
    p.add_argument("--checkpoint", default=None, help="model weights (.safetensors or .pt)")
    p.add_argument("--split", default="test", choices=["train", "test"], help="split the targets come from")
    p.add_argument("--resize", type=run_flag("resize"), default=None,
                   help="resize images to N×N")
    p.add_argument("--lpips", default="alex", choices=["alex", "vgg", "none"])
    p.add_argument("--device", type=device_name, default="auto", help="auto, cpu or cuda[:N]")


def training_from_args(args: argparse.Namespace) -> TrainingSpec:
    """The client's training the training flags declare: every TrainingSpec field under its
    scenario name (gradleak.fl.training's one list), a flag the command lacks at its default."""
    return training_from_scenario({**scenario_fields(TrainingSpec()), **vars(args)})


def spec_from_args(args: argparse.Namespace, attack: str) -> AttackRunSpec:
    return AttackRunSpec(
        dataset=args.dataset, model=args.model, attack=attack, batch_size=args.batch_size,
        defenses=tuple(args.defense), images=args.images, **training_fields(training_from_args(args)),
        seed=args.seed, threat=args.threat,
        knows=tuple(k.strip() for k in args.knows.split(",") if k.strip()),
        activation=args.activation, pretrain_steps=args.pretrain_steps, checkpoint=args.checkpoint,
        split=args.split, resize=args.resize, seq_len=args.seq_len, lpips=args.lpips,
        device=args.device)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_scenario_arguments(p)
    p.add_argument("--attack", required=True, help="attack name[:key=value,...]")
    p.add_argument("--doublings", type=run_flag("doublings"), default=0,
                   help="times the auditor may double an iterative attack's budget while its verdict is "
                        "undecided (default 0: one run at the attack's own budget)")
    p.add_argument("--out", type=output_dir(), default=None, help="directory for result.json and grid.png")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    spec = dataclasses.replace(spec_from_args(args, args.attack), doublings=args.doublings)
    if args.json:
        result = run_attack(spec)
    else:
        from ..progress import attack_progress

        with attack_progress(spec.attack) as progress:
            result = run_attack(spec, progress)
    if args.out:
        write_outputs(result, args.out)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        m = result.metrics
        fmt = lambda v: "n/a" if v is None else f"{v:.4g}"  # noqa: E731
        print(f"{spec.attack} on {spec.dataset}/{spec.model}, batch {spec.batch_size}, "
              f"{len(result.per_example)} images, defenses: {', '.join(spec.defenses) or 'none'}")
        kind = modality(result.modality)
        width = kind.terminal_width
        for line in kind.terminal_lines(m, psnr_line(m, len(result.per_example), result.extras), fmt):
            print(line)
        if m.get("reid") is not None:
            n = int(m.get("examples") or len(result.per_example))
            print(f"  {'reid':10s} {round(m['reid'] * n)} of {n} re-identified among {int(m['gallery']):,} "
                  f"(chance {100 * m['reid_chance']:.2g}%)")
        ladder = result.extras.get("ladder") or {}
        if ladder:
            iterations = int(ladder.get("iterations") or 0)
            at = f" at {iterations:,} iterations" if iterations else ""
            print(f"  {'ladder':{width}s} {ladder.get('decision')}{at}")
        print(f"  {'seconds':{width}s} {result.seconds:.1f}")
        if args.out:
            print(f"  written to {args.out}", file=sys.stderr)
    return 0


def psnr_line(metrics: dict, n_images: int, extras: dict | None = None) -> str:
    """The PSNR row of the human-readable summary: the headline (the PSNR of the mean MSE)
    with the per-image median and range beside it, or, when the attack reconstructed
    nothing, one line saying so instead of a PSNR (its metrics then score all-zero images)."""
    extras = extras or {}
    matched = metrics.get("matched")
    reconstructed = None if matched is None else round(matched * n_images)
    if reconstructed == 0:
        reason = next((str(text) for text in extras.get("message") or [] if text), "")
        _, marker, detail = reason.partition("nothing reconstructed:")
        broken = next((str(text) for text in extras.get("not_finite") or [] if text), "")
        detail = detail.strip() if marker else broken or \
            f"the attack returned no image for any of the {n_images} examples"
        return f"nothing reconstructed: {detail}; no PSNR (the other metrics score all-zero images)"
    psnr = metrics.get("psnr")
    if psnr is None:
        return f"{'psnr':10s} n/a"
    text = f"{'psnr':10s} {psnr:.1f} dB"
    notes = []
    low, high, middle = metrics.get("psnr_min"), metrics.get("psnr_max"), metrics.get("psnr_median")
    if n_images > 1:
        notes.append("from mean MSE")
        if middle is not None and low is not None and high is not None:
            notes.append(f"per image median {middle:.1f}, range {low:.1f}\u2013{high:.1f}")
    if reconstructed is not None and reconstructed < n_images:
        notes.append(f"{n_images - reconstructed} of {n_images} images not reconstructed, scored as all-zero")
    return text + (f" ({'; '.join(notes)})" if notes else "")
