"""Faces from scikit-image's LFW subset (`skimage.data.lfw_subset`, shipped in the wheel).

The subset holds 100 grayscale 25x25 faces followed by 100 non-face patches;
only the faces are used. It carries NO identities, so the labels are synthetic:
face i belongs to "group i % 10" (10 groups of 10 faces). They exist only so a
classifier has a loss to produce gradients from; they mean nothing about who is
pictured. Split: faces 0-79 train, 80-99 test; the modulo (not i // 10) puts
every group in both splits, 8 faces in train and 2 in test.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import GradleakError
from .base import Dataset, DatasetSpec
from .sources import check_split

N_FACES, N_TRAIN, N_GROUPS = 100, 80, 10
CLASS_NAMES = [f"group {i}" for i in range(N_GROUPS)]


def lfw_faces() -> np.ndarray:
    try:
        from skimage.data import lfw_subset

        images = np.asarray(lfw_subset())
    except (ImportError, OSError, ValueError) as exc:
        raise GradleakError(
            f"dataset 'lfw-faces' needs scikit-image's bundled lfw_subset.npy ({exc}): "
            "run .venv/bin/pip install scikit-image==0.26.0"
        ) from None
    if images.ndim != 3 or images.shape[0] < N_FACES:
        raise GradleakError(f"skimage lfw_subset has unexpected shape {images.shape}")
    faces = images[:N_FACES]
    if np.issubdtype(faces.dtype, np.integer):  # documented as uint8, shipped as float in [0, 1]
        return faces.astype(np.float32) / 255.0
    return np.clip(faces, 0.0, 1.0).astype(np.float32)


def load_lfw_faces(spec: DatasetSpec) -> Dataset:
    """100 LFW faces 1x25x25 with synthetic group labels (see module doc)."""
    check_split(spec.name, spec.split)
    faces = lfw_faces()
    labels = np.arange(N_FACES, dtype=np.int64) % N_GROUPS
    part = slice(0, N_TRAIN) if spec.split == "train" else slice(N_TRAIN, N_FACES)
    inputs = torch.from_numpy(np.ascontiguousarray(faces[part])).unsqueeze(1)
    return Dataset(spec.name, inputs, torch.from_numpy(labels[part]), list(CLASS_NAMES))
