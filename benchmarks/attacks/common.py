"""Helpers that several attack benchmarks share (a benchmark imports this module, never another
benchmark): the MNIST clients and gallery of the FedAvg benchmarks and their judging, and one
SPEAR batch (bench_spear, bench_spear_b25)."""
from __future__ import annotations

import time

import torch
from scipy.optimize import linear_sum_assignment

from gradleak.attacks import AttackContext, make_attack
from gradleak.data import DatasetSpec, load_dataset
from gradleak.fl import TrainingSpec, compute_update
from gradleak.metrics.reidentify import Gallery
from gradleak.metrics.scoring import score_batch, summarize
from gradleak.models import ModelSpec, build_model
from gradleak.solvers.features import FeatureExtractor
from gradleak.threat import make_threat_model, observe

GALLERY = 1000
EXACT_MSE = 1e-6


def mnist_client_data(keep_train: bool = False):
    """The clients' test split and the judge's gallery of train-split digits; with `keep_train`,
    also the train split and the gallery's rows in it (for auxiliary data kept apart from them)."""
    test = load_dataset(DatasetSpec("mnist", split="test"))
    train = load_dataset(DatasetSpec("mnist", split="train"))
    rows = torch.randperm(len(train.labels), generator=torch.Generator().manual_seed(99))[:GALLERY]
    gallery = Gallery(train.inputs[rows], "train-split MNIST digits")
    return (test, gallery, train, rows) if keep_train else (test, gallery)


def judge_reconstruction(x, y, reconstruction, labels, gallery) -> dict:
    scores, _ = score_batch(x, y, reconstruction.detach().cpu(), labels, gallery=gallery, modality="image")
    summary = summarize(scores)
    return {"recognizable": sum(bool(s.recognizable) for s in scores), "copied": sum(bool(s.success) for s in scores),
            "recognizable_or_copied": sum(bool(s.recognizable) or bool(s.success) for s in scores),
            "total": len(scores), "psnr_median": round(summary["psnr_median"], 2),
            "ssim": round(summary["ssim"], 3), "reid": summary["reid"]}


def spear_batch(data, model_spec: ModelSpec, batch: int, seed: int, doublings: int, features: str | None) -> dict:
    index = torch.randperm(len(data.inputs), generator=torch.Generator().manual_seed(1000 + seed))[:batch]
    x, y = data.inputs[index].float(), data.labels[index]
    model = build_model(model_spec)
    update = compute_update(model, x, y, TrainingSpec())
    obs = observe(update, model, make_threat_model("honest"), input_shape=tuple(x.shape[1:]),
                  num_classes=model_spec.num_classes, training=TrainingSpec(), batch_size=batch, labels=y,
                  defenses=[], modality=data.modality)
    attack = make_attack("spear")
    started = time.perf_counter()
    for rung, (_, _, sampler, solution) in enumerate(attack.search(obs, AttackContext(seed=seed))):
        if (solution is not None and solution.agreement >= 1.0) or rung >= doublings:
            break
    seconds = time.perf_counter() - started
    truth = (FeatureExtractor(model, features)(x).detach() if features else x.flatten(1)).double()
    if solution is None:
        exact = 0
    else:
        cost = torch.cdist(solution.inputs, truth) ** 2 / truth.shape[1]
        rows, cols = linear_sum_assignment(cost.numpy())
        exact = int((cost[rows, cols] <= EXACT_MSE * max(1.0, float(truth.pow(2).mean()))).sum())
    return {"exact": exact, "verified": bool(solution is not None and solution.agreement >= 1.0),
            "draws": sampler.drawn, "seconds": seconds}
