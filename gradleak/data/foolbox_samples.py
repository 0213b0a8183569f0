"""The 20 sample images foolbox 3.3.4 ships per dataset (foolbox/data/NAME_II_LABEL.ext).

Read straight from the installed wheel with PIL, never importing foolbox. They
are attack targets only (`samples_only`), so both splits return the same 20.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..errors import GradleakError
from .base import Dataset, DatasetSpec
from .sources import carrier_path, check_split
from .transforms import center_crop, resize_images
from .user_files import image_to_array, open_image

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck"]
CIFAR100_CLASSES = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus "
    "butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch "
    "crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo "
    "keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse "
    "mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy "
    "porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper "
    "snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television "
    "tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
IMAGENET_CLASSES = [f"class {i}" for i in range(1000)]
IMAGENET_SIZE = 224  # the JPEGs are 512x512 or 1024x683; foolbox also serves them at 224


def _sample_files(prefix: str, dataset: str) -> list[tuple[Path, int]]:
    """(path, label) of foolbox/data/{prefix}_{index}_{label}.{png,jpg}, in index order."""
    folder = carrier_path("foolbox", "foolbox/data", dataset=dataset, is_dir=True)
    pattern = re.compile(rf"{re.escape(prefix)}_(\d+)_(\d+)\.(png|jpg)")
    found = []
    for path in folder.iterdir():
        match = pattern.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path, int(match.group(2))))
    if not found:
        raise GradleakError(f"dataset '{dataset}': no {prefix}_*.png/jpg samples in {folder}")
    return [(path, label) for _, path, label in sorted(found)]


def _load(spec: DatasetSpec, prefix: str, class_names: list[str],
          side: int | None = None) -> Dataset:
    check_split(spec.name, spec.split)
    images, labels = [], []
    for path, label in _sample_files(prefix, spec.name):
        x = torch.from_numpy(image_to_array(open_image(path), gray=False))[None]
        if side is not None:  # shorter side to `side`, then centre square: no distortion
            h, w = x.shape[-2:]
            scale = side / min(h, w)
            x = center_crop(resize_images(x, (max(side, round(h * scale)),
                                              max(side, round(w * scale)))), side)
        images.append(x)
        labels.append(label)
    y = torch.tensor(labels, dtype=torch.int64)
    if int(y.max()) >= len(class_names):
        raise GradleakError(f"dataset '{spec.name}': sample label {int(y.max())} out of range")
    inputs = torch.cat(images).contiguous()
    return Dataset(spec.name, inputs, y, list(class_names), samples_only=True)


def load_cifar10(spec: DatasetSpec) -> Dataset:
    """20 CIFAR-10 test images, 3x32x32 (foolbox samples)."""
    return _load(spec, "cifar10", CIFAR10_CLASSES)


def load_cifar100(spec: DatasetSpec) -> Dataset:
    """20 CIFAR-100 test images, 3x32x32, fine labels (foolbox samples)."""
    return _load(spec, "cifar100", CIFAR100_CLASSES)


def load_imagenet_samples(spec: DatasetSpec) -> Dataset:
    """20 ImageNet validation images, 3x224x224 (resize + centre crop), 1000 classes."""
    return _load(spec, "imagenet", IMAGENET_CLASSES, side=IMAGENET_SIZE)

