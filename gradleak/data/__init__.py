"""Datasets: one module per source, one registry line each."""
from __future__ import annotations

from ..errors import GradleakError
from ..registry import Registry
from .base import Dataset, DatasetSpec, DataSignature

DATASETS: Registry = Registry("dataset", {
    "mnist": "gradleak.data.mnist:load_mnist",
    "fashion-mnist": "gradleak.data.fashion_mnist:load_fashion_mnist",
    "cifar10": "gradleak.data.foolbox_samples:load_cifar10",
    "cifar100": "gradleak.data.foolbox_samples:load_cifar100",
    "imagenet-samples": "gradleak.data.foolbox_samples:load_imagenet_samples",
    "lfw-faces": "gradleak.data.lfw:load_lfw_faces",
    "digits": "gradleak.data.tabular:load_digits",
    "breast-cancer": "gradleak.data.tabular:load_breast_cancer",
    "adult": "gradleak.data.adult:load_adult",
    "news": "gradleak.data.text:load_news",
    "polarity": "gradleak.data.text:load_polarity",
    "cifar-batches": "gradleak.data.user_files:load_cifar_batches",
    "mnist-idx": "gradleak.data.user_files:load_mnist_idx",
    "image-folder": "gradleak.data.user_files:load_image_folder",
    "tensors": "gradleak.data.tensors:load_tensor_file",
})

__all__ = ["DATASETS", "DataSignature", "Dataset", "DatasetSpec", "load_dataset"]

# Built-in datasets that read their files from `path`; the others come from installed
# packages, and a `path` given to them would be ignored without a word.
TAKES_PATH = ("fashion-mnist", "cifar-batches", "mnist-idx", "image-folder", "tensors")


def load_dataset(spec: DatasetSpec) -> Dataset:
    """Load `spec.name` and apply crop / resize / channel options."""
    from .transforms import apply_spec_transforms, check_spec

    check_spec(spec)
    loader = DATASETS.get(spec.name)
    if spec.path and spec.name in DATASETS.names() and spec.name not in TAKES_PATH and \
            loader.__module__.startswith("gradleak."):
        raise GradleakError(f"dataset '{spec.name}' takes no path (it is read from its installed package); "
                            f"datasets that read files: {', '.join(TAKES_PATH)}")
    return apply_spec_transforms(loader(spec), spec)
