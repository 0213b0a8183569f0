"""Dimitrov et al.'s FedAvg setting on the ReLU LeNet-5, attacked by `dense-vertices`: the
examples recovered through the features they fed the dense layers (docs/client-training.md).

The client is `fedavg_scale`'s (MNIST, 50 images, 10 epochs of mini-batches of 5, plain SGD at
lr 0.004, order unknown). Per seed:

- `true_features`: a reference from the ground truth, not an attack. The client's true features
  at the first dense layer, inverted to pixels as the attack inverts its own: how many images
  come back when the features are exact.
- `vertices`: the attack `dense-vertices` (gradleak/attacks/analytic/dense_vertices.py), which
  sees what an honest server sees plus, with `--starts-from prior` (the default), held-out
  train-split digits (the judge's gallery left out) to start its search; `--starts-from public`
  starts it from pen strokes and photographs (the first `--refined` also moved in pixels), under
  the plain honest threat model. `covered_0_98`
  (`_0_99`) counts the true examples within that cosine of some vertex the search reached (an
  oracle measure); feature quality is the cosine of each chosen feature vector to its true one,
  matched within labels. Images are judged as in `fedavg_scale`.

    python -m benchmarks fedavg_features --seeds 100,101,102,103
"""
from __future__ import annotations

import argparse
import sys
import time
from statistics import median

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from benchmarks import common
from benchmarks.attacks.common import judge_reconstruction, mnist_client_data
from gradleak.attacks import AttackContext, make_attack
from gradleak.attacks.analytic.dense_vertices import DenseVertices
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models.references import build_named_model
from gradleak.solvers.features import FeatureExtractor, invert_features
from gradleak.threat import make_threat_model, observe


def _feature_cosines(found: torch.Tensor, true: torch.Tensor, labels: torch.Tensor, true_labels) -> torch.Tensor:
    sim = nn.functional.normalize(found, dim=1) @ nn.functional.normalize(true, dim=1).T
    sim = sim.masked_fill(labels[:, None] != true_labels[None, :], -1.0)
    rows, cols = linear_sum_assignment(-sim.numpy())
    return sim[rows, cols]


def _summary(cos: torch.Tensor) -> dict:
    return {"feature_cosine_median": round(float(cos.median()), 4), "above_0_98": int((cos > 0.98).sum()),
            "above_0_99": int((cos > 0.99).sum())}


def _client(args, seed: int, test, gallery, train, gallery_rows) -> dict:
    pick = torch.randperm(len(test.labels), generator=torch.Generator().manual_seed(seed))[:args.images]
    x, y = test.inputs[pick], test.labels[pick]
    model = build_named_model(args.model, (1, 28, 28), 10, seed=seed, modality="image")
    client = TrainingSpec(lr=args.lr, local_epochs=args.epochs, local_batch_size=args.local_batch,
                          optimizer="sgd", shuffle="unknown", shuffle_seed=seed + 11)
    update = compute_update(model, x, y, client)
    attack = make_attack(f"dense-vertices:starts={args.starts},refined={args.refined},"
                         f"zeros={args.zeros.replace(',', ';')},"
                         f"realizable={args.realizable},realizable_steps={args.realizable_iterations},"
                         f"feature_steps={args.invert_iterations}"
                         + ("" if args.merge is None else f",merge={args.merge}")
                         + ("" if args.tv is None else f",feature_tv={args.tv}"))
    assert isinstance(attack, DenseVertices)
    extract = FeatureExtractor(model, attack._layer(model, (1, 28, 28)).name)
    true = extract(x).detach()
    start = time.perf_counter()
    reference = invert_features(extract, true, (1, 28, 28), attack.options.inversion(),
                                generator=AttackContext(seed=seed).generator(43))
    row: dict = {"seed": seed, "true_features": {**judge_reconstruction(x, y, reference, y, gallery),
                                                  "seconds": round(time.perf_counter() - start, 1)}}
    prior = None
    if args.starts_from == "prior":
        # train-split digits, the judge's gallery left out
        kept_apart = set(gallery_rows.tolist())
        order = torch.randperm(len(train.labels), generator=torch.Generator().manual_seed(seed + 7)).tolist()
        prior = train.subset(torch.tensor([i for i in order if i not in kept_apart][:args.starts]))
    threat = make_threat_model("honest", ["prior_data"] if prior is not None else [])
    obs = observe(update, model, threat, input_shape=(1, 28, 28), num_classes=10, training=client.server_view(),
                  batch_size=args.images, labels=y, defenses=[], prior_data=prior, modality="image")
    start = time.perf_counter()
    found = next(iter(attack.search(obs, AttackContext(seed=seed))))
    best = (nn.functional.normalize(found.pooled, dim=1) @ nn.functional.normalize(true, dim=1).T).max(0).values
    row["label_errors"] = int((torch.bincount(found.labels, minlength=10)
                               - torch.bincount(y, minlength=10)).abs().sum()) // 2
    row["vertices"] = {"starts_from": found.extras["start_source"], "covered_0_98": int((best > 0.98).sum()),
                       "covered_0_99": int((best > 0.99).sum()),
                       **_summary(_feature_cosines(found.features, true, found.labels, y)),
                       **judge_reconstruction(x, y, found.images, found.labels, gallery),
                       "seconds": round(time.perf_counter() - start, 1)}
    print(row, file=sys.stderr, flush=True)
    return row


# what --quick sets; options given after it win
QUICK = ["--images", "10", "--epochs", "2", "--starts", "1000", "--realizable", "100",
         "--realizable-iterations", "100", "--invert-iterations", "100"]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = common.parser("fedavg_features")
    parser.add_argument("--model", default="lenet5:activation=relu")
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--local-batch", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.004)
    parser.add_argument("--starts", type=int, default=10000, help="start features of the vertex search")
    parser.add_argument("--starts-from", choices=("prior", "public"), default="prior",
                        help="held-out train-split digits (prior_data granted), or pen strokes and photographs")
    parser.add_argument("--refined", type=int, default=2000,
                        help="synthetic starts also moved in pixels toward vertices (public starts only; 0: off)")
    parser.add_argument("--zeros", default="65,80",
                        help="coordinates taken as zero per vertex step; several (65,80): a search per count, pooled")
    parser.add_argument("--realizable", type=int, default=1500,
                        help="vertices inverted to pixels to rank them by residual (0: off; chosen on seeds 100-101)")
    parser.add_argument("--realizable-iterations", type=int, default=600)
    parser.add_argument("--merge", type=float, default=None,
                        help="vertices within this cosine of a chosen one count as the same example "
                             "(default: the attack's)")
    parser.add_argument("--invert-iterations", type=int, default=1000)
    parser.add_argument("--tv", type=float, default=None,
                        help="TV weight of the inversion (default: the attack's)")
    parser.add_argument("--seeds", default="100")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args([*QUICK, *argv] if "--quick" in argv else argv)


def run_with(argv: list[str]) -> dict:
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    test, gallery, train, gallery_rows = mnist_client_data(keep_train=True)
    rows = [_client(args, int(s), test, gallery, train, gallery_rows) for s in common.seed_list(args.seeds)]
    out: dict = {"setting": {k: v for k, v in vars(args).items() if k != "quick"}, "rows": rows}
    for part in ("true_features", "vertices"):
        out[part] = {"recognizable_or_copied": sum(r[part]["recognizable_or_copied"] for r in rows),
                     "total": sum(r[part]["total"] for r in rows),
                     "psnr_median_of_seeds": round(median(r[part]["psnr_median"] for r in rows), 2)}
    return out


def run(quick: bool) -> dict:
    return run_with(["--quick"] if quick else [])
