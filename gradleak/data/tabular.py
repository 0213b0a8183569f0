"""scikit-learn's bundled toy sets: digits (as 1x8x8 images) and breast cancer (tabular).

Neither ships a train/test split, so both use one deterministic stratified
80/20 split (fixed seed): every class appears in both splits, and the same
example never changes side between runs.
"""
from __future__ import annotations

import numpy as np
import torch

from .base import Dataset, DatasetSpec
from .sources import check_split

SPLIT_SEED = 0
TEST_FRACTION = 0.2


def stratified_split(labels: np.ndarray, split: str, seed: int = SPLIT_SEED,
                     test_fraction: float = TEST_FRACTION) -> np.ndarray:
    """Sorted indices of `split` under a per-class seeded 80/20 split."""
    rng = np.random.default_rng(seed)
    chosen = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_test = int(round(test_fraction * len(members)))
        chosen.append(members[n_test:] if split == "train" else members[:n_test])
    return np.sort(np.concatenate(chosen))


def standardize(train: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Scale columns of `x` by the train split's mean and std (constant columns keep std 1)."""
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return ((x - mean) / std).astype(np.float32)


def load_digits(spec: DatasetSpec) -> Dataset:
    """sklearn digits as 1x8x8 grayscale images in [0, 1] (pixel counts 0..16 / 16)."""
    from sklearn.datasets import load_digits as sk_digits

    check_split(spec.name, spec.split)
    bunch = sk_digits()
    y = np.asarray(bunch.target, dtype=np.int64)
    idx = stratified_split(y, spec.split)
    x = (np.asarray(bunch.images, dtype=np.float32)[idx] / 16.0).clip(0.0, 1.0)
    return Dataset(spec.name, torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y[idx]),
                   [str(int(c)) for c in bunch.target_names])


def load_breast_cancer(spec: DatasetSpec) -> Dataset:
    """Wisconsin breast cancer, 30 features standardized with train-split statistics."""
    from sklearn.datasets import load_breast_cancer as sk_cancer

    check_split(spec.name, spec.split)
    bunch = sk_cancer()
    x_all = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    idx = stratified_split(y, spec.split)
    x = standardize(x_all[stratified_split(y, "train")], x_all[idx])
    return Dataset(spec.name, torch.from_numpy(x), torch.from_numpy(y[idx]),
                   [str(c) for c in bunch.target_names], modality="tabular")
