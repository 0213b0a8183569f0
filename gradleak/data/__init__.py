"""Datasets: one module per source, one registry line each."""
from __future__ import annotations

from ..registry import Registry
from .base import Dataset, DatasetSpec

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
    "cifar-batches": "gradleak.data.user_files:load_cifar_batches",
    "mnist-idx": "gradleak.data.user_files:load_mnist_idx",
    "image-folder": "gradleak.data.user_files:load_image_folder",
    "tensors": "gradleak.data.tensors:load_tensor_file",
})

__all__ = ["DATASETS", "Dataset", "DatasetSpec", "load_dataset"]


def load_dataset(spec: DatasetSpec) -> Dataset:
    """Load `spec.name` and apply crop / resize / channel options."""
    from .transforms import apply_spec_transforms

    loader = DATASETS.get(spec.name)
    return apply_spec_transforms(loader(spec), spec)
