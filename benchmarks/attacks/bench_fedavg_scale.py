"""The fedavg attack at the scale of Dimitrov et al.'s FedAvg setting ("Data Leakage in Federated
Averaging", TMLR 2022): one MNIST client of `images` examples training `epochs` local epochs of
mini-batches of `local_batch` with plain SGD at their client learning rate (0.004), shuffling
each epoch with a seed the server never learns, attacked by `fedavg` (honest server, labels
recovered from the update). Per seed: images recognisable (re-identified among 1,000 train-split
digits and past the perceptual bar, docs/judging.md) or copied (MSE ≤ 1e-3), median PSNR, and
the attack's seconds. Beside it, a reference computed from the ground truth (not an attack):
the batch with every example replaced by the mean image of its class, judged the same way, and
its matching distance next to the true batch's; on this model the update barely tells the two
apart (docs/client-training.md).

`--case sigmoid`: the DLG LeNet (`lenet`, sigmoid, the literature's) at batch 4 trained as 2
epochs of mini-batches of 2 (order known), plain SGD and SGD momentum 0.9, the attack choosing
its labels among the count estimate and its one-label swaps by matching (`label_trials=swaps`).

    python -m benchmarks fedavg_scale                      # a tiny CPU run (2 epochs, 10 images)
    python -m benchmarks fedavg_scale --device cuda --images 50 --epochs 10 --local-batch 5
    python -m benchmarks fedavg_scale --case sigmoid --seeds 10,11,12,13
    python -m benchmarks fedavg_scale --case sigmoid --seeds 16 --polish 0   # without the L-BFGS polish

The command users type for the sigmoid case is `gradleak attack --dataset mnist --model lenet
--batch-size 4 --local-epochs 2 --local-batch-size 2 --attack fedavg` (docs/client-training.md).
    python -m benchmarks fedavg_scale --model lenet5:activation=relu          # another client model

`--start-noise SIGMA` is a diagnostic, not an attack: the attack starts from the true batch
(arranged as its recovered labels) plus Gaussian noise of that sd, clamped to [0, 1], to see
whether its matching leads back to the truth from nearby (docs/client-training.md).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from statistics import median

import torch

from benchmarks import common
from benchmarks.attacks.common import judge_reconstruction, mnist_client_data
from gradleak.attacks import AttackContext, make_attack
from gradleak.attacks.replay.epoch_replay import EpochReplay
from gradleak.attacks.replay.labels import recover_labels
from gradleak.attacks.replay.matching import UpdateSimulator, update_distance
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models.references import build_named_model
from gradleak.threat import make_threat_model, observe


def _class_means(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    for c in y.unique():
        out[y == c] = x[y == c].mean(0)
    return out


@contextlib.contextmanager
def _started_near(x: torch.Tensor, y: torch.Tensor, sigma: float | None):
    """`--start-noise`: fedavg's start replaced by the truth plus noise, each slot given an
    unused true example of its recovered label (any unused one where the counts are off)."""
    if sigma is None:
        yield
        return
    import gradleak.attacks.optimization.fedavg as fedavg

    own = fedavg.observed_start

    def start(init, shape, generator, obs, labels, ctx):
        if tuple(shape) != tuple(x.shape):
            raise SystemExit("--start-noise: the attack optimises per-epoch copies here; use the epoch replay")
        used: set[int] = set()
        rows = []
        for label in labels.tolist():
            free = [i for i in range(len(y)) if i not in used]
            i = next((i for i in free if int(y[i]) == label), free[0])
            used.add(i)
            rows.append(i)
        return (x[rows] + sigma * torch.randn(x.shape, generator=generator)).clamp(0, 1)

    fedavg.observed_start = start
    try:
        yield
    finally:
        fedavg.observed_start = own


def _client(args, seed: int, test, gallery) -> dict:
    device = torch.device(args.device)
    pick = torch.randperm(len(test.labels), generator=torch.Generator().manual_seed(seed))[:args.images]
    x, y = test.inputs[pick], test.labels[pick]
    model = build_named_model(args.model, (1, 28, 28), 10, seed=seed, modality="image")
    client = TrainingSpec(lr=args.lr, local_epochs=args.epochs, local_batch_size=args.local_batch,
                          optimizer=args.optimizer, shuffle=args.order, shuffle_seed=seed + 11)
    update = compute_update(model, x, y, client)
    obs = observe(update, model, make_threat_model("honest"), input_shape=(1, 28, 28), num_classes=10,
                  training=client.server_view(), batch_size=args.images, labels=y, defenses=[], modality="image")
    attack = make_attack(f"fedavg:iterations={args.iterations},distance={args.distance},replay={args.replay},"
                         f"lr={args.attack_lr},tv={args.tv},optimizer={args.attack_optimizer},"
                         f"restarts={args.restarts},label_trials={args.label_trials}"
                         + (f",polish={args.polish}" if args.polish is not None else ""))
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with _started_near(x, y, args.start_noise):
        result = attack.reconstruct(obs, AttackContext(seed=seed, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    counts = lambda labels: torch.bincount(labels.cpu(), minlength=10)  # noqa: E731
    row = {"seed": seed, "seconds": round(seconds, 1), "replay": result.extras.get("replay"),
           "label_errors": int((counts(result.labels) - counts(y)).abs().sum()) // 2,
           "count_estimate_errors": int((counts(recover_labels(obs, "auto", AttackContext(seed=seed).generator(17)))
                                         - counts(y)).abs().sum()) // 2,
           "final_distance": round(result.final_distance, 6),
           "label_trials": result.extras.get("label_trials"),
           **judge_reconstruction(x, y, result.inputs, result.labels, gallery)}
    if args.case == "lenet5":
        # ground-truth reference: each example replaced by its class's mean image
        # and the matching distances of the true batch and of that one, under the client's true
        # order (an oracle) and under the order-free replay the attack uses
        means = _class_means(x, y)
        reference = {"class_means": judge_reconstruction(x, y, means, y, gallery)}
        oracle = observe(update, model, make_threat_model("honest"), input_shape=(1, 28, 28), num_classes=10,
                         training=dataclasses.replace(client, shuffle="known"), batch_size=args.images, labels=y,
                         defenses=[], modality="image")
        sims = {"true_order": UpdateSimulator(oracle)}
        if result.extras.get("replay") == "epochs":
            sims["epoch_replay"] = EpochReplay(obs)
        for name, sim in sims.items():
            target = {n: update.tensors[n] for n in sim.names}
            reference[f"distance_{name}"] = {
                "truth": round(float(update_distance(sim(x, y), target, args.distance).detach()), 7),
                "class_means": round(float(update_distance(sim(means, y), target, args.distance).detach()), 7)}
        row["reference"] = reference
    print(json.dumps({"optimizer": args.optimizer, **row}), file=sys.stderr, flush=True)  # each client as it finishes
    return row


QUICK = ["--iterations", "50"]  # what --quick sets; options given after it win


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = common.parser("fedavg_scale")
    parser.add_argument("--case", choices=["lenet5", "sigmoid"], default="lenet5")
    parser.add_argument("--model", default=None, help="the client model (default lenet5; lenet for --case sigmoid)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--local-batch", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None, help="the client's learning rate")
    parser.add_argument("--optimizer", default=None,
                        help="the client's (default sgd; the sigmoid case runs sgd and sgd:momentum=0.9 unless given)")
    parser.add_argument("--order", choices=["unknown", "known"], default=None)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--replay", choices=["auto", "steps", "epochs"], default=None,
                        help="the attack's replay (default: epochs for lenet5, auto for sigmoid)")
    parser.add_argument("--distance", default=None,
                        help="the attack's (default: layer-cosine for lenet5, whose whole-update cosine the head "
                             "dominates; cosine for sigmoid, chosen on seeds 100-101)")
    parser.add_argument("--attack-lr", type=float, default=0.1)
    parser.add_argument("--attack-optimizer", choices=["signed-adam", "adam", "lbfgs"], default="signed-adam")
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--polish", type=float, default=None,
                        help="fedavg's L-BFGS polish, a share of the rung's iterations (default: its own; 0: off)")
    parser.add_argument("--tv", type=float, default=1e-4)
    parser.add_argument("--label-trials", choices=["auto", "off", "swaps"], default=None,
                        help="the attack's label search (default: swaps for sigmoid, off for lenet5)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--start-noise", type=float, default=None,
                        help="diagnostic: start the attack from the true batch plus noise of this sd (not an attack)")
    args = parser.parse_args([*QUICK, *argv] if "--quick" in argv else argv)
    sigmoid = args.case == "sigmoid"
    defaults = {"images": 4 if sigmoid else 10, "epochs": 2, "local_batch": 2 if sigmoid else 5,
                "lr": 0.01 if sigmoid else 0.004, "optimizer": "sgd", "order": "known" if sigmoid else "unknown",
                "iterations": 2000 if sigmoid else 200, "replay": "auto" if sigmoid else "epochs",
                "distance": "cosine" if sigmoid else "layer-cosine", "label_trials": "swaps" if sigmoid else "off"}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.model is None:
        args.model = "lenet" if sigmoid else "lenet5"
    return args


def run_with(argv: list[str]) -> dict:
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    test, gallery = mnist_client_data()
    seeds = list(common.seed_list(args.seeds))
    optimizers = ["sgd", "sgd:momentum=0.9"] if args.case == "sigmoid" and "--optimizer" not in argv \
        else [args.optimizer]
    out = {"setting": {k: v for k, v in vars(args).items() if k not in ("seeds", "quick")}, "seeds": seeds, "runs": []}
    for optimizer in optimizers:
        args.optimizer = optimizer
        rows = [_client(args, seed, test, gallery) for seed in seeds]
        total = sum(r["total"] for r in rows)
        out["runs"].append({
            "optimizer": optimizer, "rows": rows,
            "recognizable_or_copied": sum(r["recognizable_or_copied"] for r in rows), "total": total,
            "fraction": round(sum(r["recognizable_or_copied"] for r in rows) / total, 3),
            "psnr_median_of_seeds": round(median(r["psnr_median"] for r in rows), 2),
            "seconds_per_client": round(median(r["seconds"] for r in rows), 1)})
    return out


def run(quick: bool) -> dict:
    return run_with(["--quick"] if quick else [])
