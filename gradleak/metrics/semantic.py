"""Semantic match: a stand-in for Yue et al.'s tag-based ROGS score.

Yue et al. measure semantic leakage with a multi-label tagging network, which
cannot be loaded offline. Instead: the fraction of reconstructions that a
classifier trained on the dataset assigns to the original example's label. A
reconstruction that is blurry but keeps the object still counts as a leak.
"""
from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def semantic_matches(classifier: nn.Module, reconstructions: torch.Tensor, labels: torch.Tensor,
                     batch_size: int = 64) -> torch.Tensor:
    """Boolean per reconstruction: classifier's arg-max == the original's label.

    `reconstructions` must already be aligned with `labels` (e.g. the aligned
    tensor `score_batch` returns, or `AttackRunResult.reconstructions`)."""
    if reconstructions.shape[0] != labels.shape[0]:
        raise ValueError(f"{reconstructions.shape[0]} reconstructions but {labels.shape[0]} labels")
    was_training = classifier.training
    classifier.eval()
    try:
        device = next(classifier.parameters()).device
        preds = [classifier(chunk.to(device)).argmax(-1).cpu()
                 for chunk in reconstructions.split(batch_size)]
    finally:
        classifier.train(was_training)
    return torch.cat(preds) == labels.cpu()


def semantic_match(classifier: nn.Module, reconstructions: torch.Tensor, labels: torch.Tensor,
                   batch_size: int = 64) -> float:
    """Fraction of reconstructions the classifier assigns to the original's label."""
    return float(semantic_matches(classifier, reconstructions, labels, batch_size).float().mean())
