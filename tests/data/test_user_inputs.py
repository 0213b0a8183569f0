"""The user's own data files and model references: every accepted form, every
refusal a single GradleakError line, nothing executed from a data file."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from gradleak.data import DatasetSpec, load_dataset
from gradleak.data.references import dataset_spec
from gradleak.data.tensors import dataset_from_tensors, dataset_from_user
from gradleak.errors import GradleakError
from gradleak.models.user import build_user_model, check_model_fits, is_user_model_ref


def _images(n=6):
    gen = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 8, 8, generator=gen), torch.arange(n) % 3


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".pt"])
def test_tensor_files_round_trip(tmp_path, suffix):
    x, y = _images()
    path = tmp_path / f"client{suffix}"
    if suffix == ".npz":
        np.savez(path, x=x.numpy(), targets=y.numpy())
    elif suffix == ".safetensors":
        save_file({"inputs": x, "labels": y}, str(path))
    else:
        torch.save((x, y), path)
    for spec in (DatasetSpec("tensors", path=str(path)), dataset_spec(str(path), "test", None)):
        data = load_dataset(spec)
        assert torch.equal(data.inputs, x) and torch.equal(data.labels, y)
        assert data.modality == "image" and data.num_classes == 3


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_payloads_are_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    payload = _Payload()
    payload.marker = marker
    pt = tmp_path / "evil.pt"
    pt.write_bytes(pickle.dumps({"inputs": payload, "labels": torch.zeros(2)}))
    with pytest.raises(GradleakError, match="rejected"):
        load_dataset(DatasetSpec("tensors", path=str(pt)))
    npz = tmp_path / "evil.npz"
    np.savez(npz, inputs=np.array([payload, payload], dtype=object), labels=np.zeros(2))
    with pytest.raises(GradleakError, match="rejected"):
        load_dataset(DatasetSpec("tensors", path=str(npz)))
    assert not marker.exists()


@pytest.mark.parametrize("content, message", [
    (b"not a zip", "not a valid .npz"),
    (b"", "not a valid .npz"),
])
def test_corrupted_npz(tmp_path, content, message):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(GradleakError, match=message):
        load_dataset(DatasetSpec("tensors", path=str(path)))


def test_truncated_safetensors_and_missing_keys(tmp_path):
    x, y = _images()
    good = tmp_path / "good.safetensors"
    save_file({"inputs": x, "labels": y}, str(good))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(good.read_bytes()[:50])
    with pytest.raises(GradleakError, match="not a valid safetensors"):
        load_dataset(DatasetSpec("tensors", path=str(bad)))
    keys = tmp_path / "keys.safetensors"
    save_file({"pixels": x}, str(keys))
    with pytest.raises(GradleakError, match="no inputs"):
        load_dataset(DatasetSpec("tensors", path=str(keys)))
    with pytest.raises(GradleakError, match="not found"):
        dataset_spec(str(tmp_path / "absent.npz"), "test", None)


@pytest.mark.parametrize("inputs, labels, message", [
    (torch.rand(4, 1, 8, 8), torch.arange(3), "4 inputs but 3 labels"),
    (torch.full((2, 1, 4, 4), float("nan")), torch.zeros(2), "NaN"),
    (torch.rand(2, 1, 4, 4) * 255, torch.zeros(2), r"\[0, 1\]"),
    (torch.rand(2, 1, 4, 4), torch.tensor([0.5, 1.0]), "whole class"),
    (torch.rand(2, 1, 4, 4), torch.tensor([-1, 0]), ">= 0"),
    (torch.rand(2), torch.zeros(2), "inputs must be"),
    (torch.zeros(0, 3), torch.zeros(0), "empty"),
    (np.array(["a", "b"]), np.zeros(2), "numeric"),
])
def test_bad_tensors_are_refused(inputs, labels, message):
    with pytest.raises(GradleakError, match=message):
        dataset_from_tensors(inputs, labels)


def test_layouts_and_dtypes():
    x = (torch.rand(3, 8, 8, 3) * 255).to(torch.uint8)  # channels-last uint8
    data = dataset_from_tensors(x, torch.tensor([0, 1, 2]))
    assert data.input_shape == (3, 8, 8) and float(data.inputs.max()) <= 1
    assert dataset_from_tensors(torch.rand(3, 8, 8), [0, 1, 1]).input_shape == (1, 8, 8)
    tabular = dataset_from_tensors(torch.randn(5, 4) * 10, torch.zeros(5))
    assert tabular.modality == "tabular"
    with pytest.raises(GradleakError, match="out of range"):
        dataset_from_tensors(torch.rand(2, 4), [0, 5], num_classes=3)


def test_user_forms_agree():
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _images(10)
    forms = [(x, y), {"images": x, "targets": y}, TensorDataset(x, y), DataLoader(TensorDataset(x, y), batch_size=3)]
    for form in forms:
        data = dataset_from_user(form)
        assert torch.equal(data.inputs, x) and torch.equal(data.labels, y)
    assert len(dataset_from_user(DataLoader(TensorDataset(x, y), batch_size=3), limit=4)) == 4
    with pytest.raises(GradleakError, match="DataLoader"):
        dataset_from_user(42)


MODEL_FILE = """
from torch import nn

class Net(nn.Module):
    def __init__(self, num_classes, in_channels, width=4):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(width * 64, num_classes))
    def forward(self, x):
        return self.body(x)

def empty():
    return nn.Sequential()

def raises(**kwargs):
    raise SystemExit("no")
"""


def test_user_model_references(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(MODEL_FILE)
    assert is_user_model_ref(f"{path}:Net") and is_user_model_ref("pkg.models:Net")
    assert not is_user_model_ref("lenet") and not is_user_model_ref("convnet:width=64")
    a = build_user_model(f"{path}:Net:width=6", (1, 8, 8), 10, seed=3)
    b = build_user_model(f"{path}:Net:width=6", (1, 8, 8), 10, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert a.body[0].out_channels == 6 and check_model_fits(a, (1, 8, 8), 10, modality="image") == 10
    module_model = build_user_model("torch.nn:Linear:in_features=3,out_features=2", (3,), 2, seed=0)
    assert isinstance(module_model, nn.Linear)
    for ref, message in [(f"{path}:empty", "no parameters"), (f"{path}:raises", "SystemExit"),
                         (f"{path}:missing", "has no 'missing'"), (f"{path}", "name the factory"),
                         ("no.such.module:Net", "not found"), (f"{tmp_path}/x.txt:Net", "not a .py")]:
        with pytest.raises(GradleakError, match=message):
            build_user_model(ref, (1, 8, 8), 10, seed=0)
    with pytest.raises(GradleakError, match="outputs 10 logits"):
        check_model_fits(a, (1, 8, 8), 12, modality="image")
    with pytest.raises(GradleakError, match="cannot take inputs"):
        check_model_fits(a, (3, 8, 8), 10, modality="image")


def test_user_model_with_checkpoint_through_the_cli(tmp_path, capsys):
    from gradleak.cli import main
    from gradleak.models.checkpoint import save_checkpoint

    path = tmp_path / "net.py"
    path.write_text(MODEL_FILE)
    trained = build_user_model(f"{path}:Net", (1, 8, 8), 3, seed=11)
    weights = save_checkpoint(trained, tmp_path / "w.safetensors")
    x, y = _images()
    data = tmp_path / "d.safetensors"
    save_file({"inputs": x, "labels": y}, str(data))
    code = main(["attack", "--model", f"{path}:Net", "--checkpoint", str(weights), "--dataset", str(data),
                 "--attack", "dlg:iterations=3", "--lpips", "none", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    wrong = save_checkpoint(build_user_model(f"{path}:Net:width=5", (1, 8, 8), 3, seed=0), tmp_path / "v.pt")
    code = main(["attack", "--model", f"{path}:Net", "--checkpoint", str(wrong), "--dataset", str(data),
                 "--attack", "dlg", "--json"])
    err = capsys.readouterr().err
    assert code == 2 and "does not fit" in err and len(err.strip().splitlines()) == 1
