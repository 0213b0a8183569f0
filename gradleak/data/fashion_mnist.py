"""Fashion-MNIST from Debian's `dataset-fashion-mnist` package (IDX .gz files).

`:path=DIR` reads the same four files from another folder instead.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import GradleakError
from .base import Dataset, DatasetSpec
from .sources import check_split
from .user_files import idx_dataset, read_idx_split

DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def load_fashion_mnist(spec: DatasetSpec) -> Dataset:
    """Zalando's clothing images 1x28x28, 60k train / 10k test, 10 classes."""
    check_split(spec.name, spec.split)
    folder = Path(spec.path).expanduser() if spec.path else DEFAULT_DIR
    if not folder.is_dir():
        if spec.path:
            raise GradleakError(f"dataset '{spec.name}': path {folder} is not a folder")
        raise GradleakError(f"dataset '{spec.name}' needs the Fashion-MNIST files in {folder}: "
                            "run: apt-get install dataset-fashion-mnist")
    images, labels = read_idx_split(folder, spec.split)
    return idx_dataset(spec.name, images, labels, list(CLASS_NAMES))
