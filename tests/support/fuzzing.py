"""Malformed and hostile inputs for every sub-command and every file reader.

`make_files(root)` writes the hostile files once; `generate_cases()` returns the
cases, deterministically (seeded), as argv lists whose `{F}` (the files folder)
and `{O}` (the case's own output folder, also its working directory) are filled
in when a case runs. Every case must fail at validation: exit code 2 and one
line on stderr, quickly, without writing outside `{O}` or running code from a file.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import pickle
import random
import sqlite3
import struct
import typing
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEED = 20240611
MARKER = "pwned-marker"  # a payload that runs creates {F}/pwned-marker

# A valid, fast scenario: each case breaks exactly one part of it.
TAB = "{F}/tab.npz"          # 8 tabular examples, 6 features, 2 classes
IMG = "{F}/img.npz"          # 8 gray 16×16 images, 2 classes
BASE_ATTACK = ["attack", "--dataset", TAB, "--model", "mlp:hidden=8", "--attack", "dlg:iterations=1",
               "--lpips", "none", "--json"]
BASE_IMAGE_ATTACK = ["attack", "--dataset", IMG, "--model", "convnet:width=2", "--attack", "dlg:iterations=1",
                     "--lpips", "none", "--json"]


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    expect: str | None = None   # a fragment the error line must contain (case-insensitive)
    xfail: str | None = None    # the failure class, when it belongs to a module owned elsewhere

    def resolve(self, files: Path, out: Path) -> list[str]:
        return [a.replace("{F}", str(files)).replace("{O}", str(out)) for a in self.argv]


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


# --------------------------------------------------------------------------- hostile files


class _Payload:
    """Unpickling it runs `touch MARKER`: a loader that executes it fails the suite."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _ExecPayload(_Payload):
    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def _png(width: int, height: int, pixels: bytes | None = None, color_type: int = 0) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    channels = {0: 1, 2: 3}[color_type]
    if pixels is None:
        row = b"\x00" + bytes(range(width * channels)) if width * channels < 256 else b"\x00" * (width * channels + 1)
        pixels = row * height
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(pixels))
            + chunk(b"IEND", b""))


def _image_folder(root: Path, images: dict[str, bytes]) -> None:
    """root/a/*.png (the hostile ones) and root/b/ok*.png (good ones)."""
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    good = _png(8, 8)
    for i in range(3):
        (root / "b" / f"ok{i}.png").write_bytes(good)
        (root / "a" / f"ok{i}.png").write_bytes(good)
    for name, data in images.items():
        (root / "a" / name).write_bytes(data)


def _idx(dtype: int, dims: tuple[int, ...], data: bytes) -> bytes:
    return bytes([0, 0, dtype, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


def _cifar(root: Path, batch: object, meta: object | None = None, raw: bytes | None = None) -> None:
    root.mkdir(parents=True)
    (root / "test_batch").write_bytes(raw if raw is not None else pickle.dumps(batch, protocol=2))
    if meta is not None:
        (root / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


def _store(path: Path, rows: list[tuple], images: list[tuple] = ()) -> None:
    """A gradleak-format store holding the given raw rows (as a foreign tool might write them)."""
    from gradleak.store import ResultStore

    ResultStore(path).close()
    conn = sqlite3.connect(path)
    conn.executemany("INSERT INTO cells VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    conn.executemany("INSERT INTO images VALUES (?,?,?,?,?)", images)
    conn.commit()
    conn.close()


GOOD_LABELS = json.dumps({"attack": "ig", "attack_spec": "ig", "defense": "none", "strength": "", "batch_size": 1,
                          "local_steps": 1, "seed": 0, "dataset": "d", "model": "m"})


def _row(key="k1", kind="attack", labels=GOOD_LABELS, metrics='{"mse": 0.1}',
         spec="{}", extras="{}", seconds=1.0, grid=None, cpu=None, modality="tabular"):
    return (key, kind, "s", spec, labels, metrics, extras, seconds, cpu, grid, 1.0, modality)


def make_files(root: Path) -> None:
    """Write every hostile input file under `root` (once per test session)."""
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    marker = root / MARKER
    gen = np.random.default_rng(0)
    np.savez(root / "tab.npz", inputs=gen.normal(size=(8, 6)).astype(np.float32), labels=np.arange(8) % 2)
    np.savez(root / "img.npz", inputs=gen.random((8, 1, 16, 16)).astype(np.float32), labels=np.arange(8) % 2)

    # tensor files
    tensors = root / "tensors"
    tensors.mkdir()
    np.savez(tensors / "nan.npz", inputs=np.full((4, 6), np.nan, np.float32), labels=np.zeros(4))
    np.savez(tensors / "inf.npz", inputs=np.full((4, 1, 8, 8), np.inf, np.float32), labels=np.zeros(4))
    np.savez(tensors / "object.npz", inputs=np.array([_Payload(marker)] * 2, dtype=object), labels=np.zeros(2))
    np.savez(tensors / "strings.npz", inputs=np.array(["a", "b"]), labels=np.zeros(2))
    np.savez(tensors / "mismatch.npz", inputs=np.zeros((4, 6), np.float32), labels=np.zeros(3))
    np.savez(tensors / "nolabels.npz", inputs=np.zeros((4, 6), np.float32))
    np.savez(tensors / "neglabels.npz", inputs=np.zeros((4, 6), np.float32), labels=-np.ones(4))
    np.savez(tensors / "fraclabels.npz", inputs=np.zeros((4, 6), np.float32), labels=np.full(4, 0.5))
    np.savez(tensors / "hugelabels.npz", inputs=np.zeros((4, 6), np.float32), labels=np.full(4, 2**62))
    np.savez(tensors / "empty.npz", inputs=np.zeros((0, 6), np.float32), labels=np.zeros(0))
    np.savez(tensors / "scalar.npz", inputs=np.float32(3), labels=np.zeros(1))
    np.savez(tensors / "5d.npz", inputs=np.zeros((2, 1, 1, 4, 4), np.float32), labels=np.zeros(2))
    np.savez(tensors / "range.npz", inputs=np.full((4, 1, 8, 8), 7.0, np.float32), labels=np.zeros(4))
    np.savez(tensors / "complex.npz", inputs=np.zeros((4, 6), np.complex64), labels=np.zeros(4))
    (tensors / "garbage.npz").write_bytes(b"PK\x03\x04" + bytes(gen.integers(0, 256, 200, dtype=np.uint8)))
    (tensors / "empty_file.npz").write_bytes(b"")
    (tensors / "text.npz").write_text("inputs,labels\n1,2\n")
    with open(root / "img.npz", "rb") as fh:
        (tensors / "truncated.npz").write_bytes(fh.read()[:300])
    save_file({"inputs": torch.zeros(4, 6), "labels": torch.zeros(4)}, str(tensors / "good.safetensors"))
    raw = (tensors / "good.safetensors").read_bytes()
    (tensors / "truncated.safetensors").write_bytes(raw[:40])
    (tensors / "hugeheader.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
    (tensors / "badjson.safetensors").write_bytes(struct.pack("<Q", 5) + b"{{{{{")
    (tensors / "overlap.safetensors").write_bytes(struct.pack("<Q", 60) + json.dumps(
        {"inputs": {"dtype": "F32", "shape": [1000000, 1000000], "data_offsets": [0, 8]}}).encode().ljust(60))
    save_file({"pixels": torch.zeros(4, 6)}, str(tensors / "keys.safetensors"))
    (tensors / "payload.pt").write_bytes(pickle.dumps({"inputs": _Payload(marker), "labels": [0]}))
    (tensors / "exec.pt").write_bytes(pickle.dumps({"inputs": _ExecPayload(marker), "labels": [0]}))
    buf = io.BytesIO()
    torch.save({"inputs": torch.zeros(4, 6), "labels": torch.zeros(4)}, buf)
    (tensors / "truncated.pt").write_bytes(buf.getvalue()[:100])
    (tensors / "random.pt").write_bytes(bytes(gen.integers(0, 256, 500, dtype=np.uint8)))
    torch.save([1, 2, 3], tensors / "list.pt")
    torch.save({"inputs": "text", "labels": torch.zeros(4)}, tensors / "textinputs.pt")
    (tensors / "dir.npz").mkdir()
    (tensors / "latin1.pt").write_bytes("donn\xe9es \x00\x00".encode("latin-1"))

    # image folders
    images = root / "images"
    good = _png(8, 8)
    _image_folder(images / "truncated", {"cut.png": good[:-12]})
    _image_folder(images / "truncated_idat", {"cut.png": good[:45]})
    _image_folder(images / "zero", {"zero.png": b""})
    _image_folder(images / "text", {"text.png": b"not an image at all\n"})
    _image_folder(images / "bomb", {"bomb.png": _png(30000, 30000, pixels=b"")})
    _image_folder(images / "badcrc", {"crc.png": good[:20] + b"\xff" + good[21:]})
    _image_folder(images / "nul", {"nul.png": b"\x00" * 64})
    _image_folder(images / "jpeg_garbage", {"x.jpg": b"\xff\xd8\xff\xe0" + b"\x00" * 40})
    (images / "empty").mkdir()
    (images / "noimages" / "a").mkdir(parents=True)
    (images / "noimages" / "a" / "readme.txt").write_text("nothing")

    # IDX folders (MNIST layout)
    idx = root / "idx"
    labels = _idx(0x08, (4,), bytes(4))

    def idx_folder(name: str, images_bytes: bytes, labels_bytes: bytes = labels, gz: bool = False) -> None:
        folder = idx / name
        folder.mkdir(parents=True)
        suffix = ".gz" if gz else ""
        opener = gzip.compress if gz else (lambda b: b)
        (folder / f"t10k-images-idx3-ubyte{suffix}").write_bytes(opener(images_bytes))
        (folder / f"t10k-labels-idx1-ubyte{suffix}").write_bytes(opener(labels_bytes))

    idx_folder("overflow", _idx(0x08, (2**32 - 1, 2**32 - 1, 2**32 - 1), bytes(16)))
    idx_folder("overflow64", _idx(0x08, (65536, 65536, 65536), bytes(16)))
    idx_folder("zero_dims", _idx(0x08, (), b""))
    idx_folder("badmagic", b"\x01\x02\x03\x04" + bytes(100))
    idx_folder("truncated", _idx(0x08, (4, 8, 8), bytes(100)))
    idx_folder("floats", _idx(0x0D, (4, 8, 8), bytes(4 * 256)))
    idx_folder("labels_mismatch", _idx(0x08, (4, 8, 8), bytes(256)), _idx(0x08, (3,), bytes(3)))
    idx_folder("bad_gzip", b"", b"")
    (idx / "bad_gzip" / "t10k-images-idx3-ubyte").unlink()
    (idx / "bad_gzip" / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08garbage")
    idx_folder("empty_file", b"")
    (idx / "missing").mkdir()

    # CIFAR batches
    cifar = root / "cifar"
    data = np.zeros((2, 3072), np.uint8)
    _cifar(cifar / "nan", {b"data": np.full((2, 3072), np.nan), b"labels": [0, 1]})
    _cifar(cifar / "nested", {b"data": data, b"labels": [[0, 1], [1]]})
    _cifar(cifar / "dict_labels", {b"data": data, b"labels": {"a": 1, "b": 2}})
    _cifar(cifar / "nan_labels", {b"data": data, b"labels": [float("nan"), 1.0]})
    _cifar(cifar / "str_labels", {b"data": data, b"labels": ["cat", "dog"]})
    _cifar(cifar / "int_names", {b"data": data, b"labels": [0, 1]}, {b"label_names": 7})
    _cifar(cifar / "dict_names", {b"data": data, b"labels": [0, 1]}, {b"label_names": {"a": 1}})
    _cifar(cifar / "few_names", {b"data": data, b"labels": [0, 5]}, {b"label_names": [b"a", b"b"]})
    _cifar(cifar / "wrong_shape", {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]})
    _cifar(cifar / "not_dict", [1, 2, 3])
    _cifar(cifar / "missing_key", {b"data": data})
    _cifar(cifar / "payload", None, raw=pickle.dumps({b"data": _Payload(marker), b"labels": [0]}))
    _cifar(cifar / "exec_payload", None, raw=pickle.dumps({b"data": _ExecPayload(marker), b"labels": [0]}))
    _cifar(cifar / "truncated", None, raw=pickle.dumps({b"data": data, b"labels": [0, 1]}, protocol=2)[:50])
    _cifar(cifar / "latin1", None, raw="d\xe9j\xe0 vu\x00".encode("latin-1"))
    _cifar(cifar / "data_list", {b"data": [[0] * 3072] * 2, b"labels": [0, 1]})
    _cifar(cifar / "neg_labels", {b"data": data, b"labels": [-1, 0]})
    _cifar(cifar / "bool_labels", {b"data": data, b"labels": [True, False]})
    (cifar / "empty").mkdir()

    # checkpoints
    ckpt = root / "ckpt"
    ckpt.mkdir()
    (ckpt / "payload.pt").write_bytes(pickle.dumps({"w": _Payload(marker)}))
    (ckpt / "exec.pt").write_bytes(pickle.dumps(_ExecPayload(marker)))
    (ckpt / "random.pt").write_bytes(bytes(gen.integers(0, 256, 300, dtype=np.uint8)))
    (ckpt / "empty.pt").write_bytes(b"")
    (ckpt / "random.safetensors").write_bytes(bytes(gen.integers(0, 256, 300, dtype=np.uint8)))
    (ckpt / "hugeheader.safetensors").write_bytes(struct.pack("<Q", 2**63) + b"{}")
    torch.save({"nothing": torch.zeros(3)}, ckpt / "wrong_keys.pt")
    torch.save([torch.zeros(3)], ckpt / "list.pt")
    torch.save({"w": "text"}, ckpt / "text_values.pt")
    save_file({"x": torch.zeros(2)}, str(ckpt / "wrong.safetensors"))
    (ckpt / "dir.pt").mkdir()
    (ckpt / "latin1.pt").write_bytes("caf\xe9\x00".encode("latin-1"))

    # sweep files
    sweeps = root / "sweeps"
    sweeps.mkdir()
    (sweeps / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (sweeps / "nul.yaml").write_bytes(b"name: a\x00b\n")
    (sweeps / "nested.yaml").write_text("[" * 10000 + "]" * 10000)
    (sweeps / "nested_map.yaml").write_text("a: " + "{b: " * 3000 + "1" + "}" * 3000)
    (sweeps / "empty.yaml").write_text("")
    (sweeps / "list.yaml").write_text("- 1\n- 2\n")
    (sweeps / "scalar.yaml").write_text("42\n")
    (sweeps / "bad_yaml.yaml").write_text("a: [1, 2\nb: }\n")
    (sweeps / "bogus_defense.yaml").write_text(
        "name: x\ndataset: digits\nmodel: mlp\nattacks: [dlg]\ndefaults: {defenses: [bogus]}\n")
    (sweeps / "number_defense.yaml").write_text(
        "name: x\ndataset: digits\nmodel: mlp\nattacks: [dlg]\ndefaults: {defenses: 5}\n")
    (sweeps / "negative_seed.yaml").write_text(
        "name: x\ndataset: digits\nmodel: mlp\nattacks: [dlg]\ndefaults: {seed: -5}\n")
    (sweeps / "python_tag.yaml").write_text(f"!!python/object/apply:os.system ['touch {marker}']\n")
    (sweeps / "anchors.yaml").write_text("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                                         "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c]\n")
    (sweeps / "dir.yaml").mkdir()
    (sweeps / "binary.yaml").write_bytes(bytes(gen.integers(0, 256, 300, dtype=np.uint8)))
    (sweeps / "utf16.yaml").write_bytes("name: x\n".encode("utf-16"))
    # a valid, fast sweep: the cases that use it break one flag or one field
    ok_sweep = f"name: ok\ndefaults: {{lpips: none}}\ngrids:\n  - datasets: [{root / 'tab.npz'}]\n" \
               "    models: [mlp:hidden=8]\n    attacks: [dlg:iterations=1]\n"
    (sweeps / "ok.yaml").write_text(ok_sweep)
    for name, device in (("mps", "mps"), ("number", "5"), ("cuda99", "cuda:99"), ("list", "[cpu, cuda]"),
                         ("injected", "'cpu;rm -rf x'")):
        (sweeps / f"device_{name}.yaml").write_text(ok_sweep.replace("{lpips: none}",
                                                                     f"{{lpips: none, device: {device}}}"))
    # scenario numbers beyond the command line's bounds (the same bounds apply in sweep files)
    for name, field in (("lr_nan", "lr: .nan"), ("lr_huge", "lr: 1e99"), ("steps_huge", "local_steps: 1000000000"),
                        ("batch_huge", "batch_sizes: [1000000000]"), ("seed_huge", "seeds: [18446744073709551616]"),
                        ("lr_text", "lr: fast")):
        text = ok_sweep.replace("    attacks:", f"    {field}\n    attacks:") if field.startswith(("batch", "seeds")) \
            else ok_sweep.replace("{lpips: none}", f"{{lpips: none, {field}}}")
        (sweeps / f"number_{name}.yaml").write_text(text)
    # one bad value in a second, last grid: refused before the first grid's cells run
    last_grid = f"  - datasets: [{root / 'tab.npz'}]\n    models: [mlp:hidden=8]\n    attacks: [dlg:iterations=1]\n"
    for name, field in (("model_negative", "    models: ['mlp:hidden=-4']"),
                        ("model_text", "    models: ['mlp:hidden=x']"),
                        ("dataset_resize", "    datasets: ['mnist:resize=99999']"),
                        ("checkpoint", "    defaults: {checkpoint: absent.safetensors}"),
                        ("activation", "    defaults: {activation: swishy}"),
                        ("defenses_type", "    defaults: {defenses: 5}"), ("knows_type", "    defaults: {knows: 7}"),
                        ("too_few", "    batch_sizes: [9]"), ("threat", "    attacks: [{name: rtf, threat: honest}]")):
        (sweeps / f"last_{name}.yaml").write_text(ok_sweep + last_grid + field + "\n")
    (sweeps / "last_utility_model.yaml").write_text(
        ok_sweep + "utility: {options: {model: 'mlp:activation=swishy', rounds: 1}}\n")
    # a grid of 10^6 cells is refused before any cell is built
    (sweeps / "grid_huge.yaml").write_text(ok_sweep.replace(
        "    attacks:", f"    seeds: {list(range(1000))}\n    batch_sizes: {list(range(1, 101))}\n"
                       f"    local_steps: {list(range(1, 11))}\n    attacks:"))

    # stores
    stores = root / "stores"
    stores.mkdir()
    (stores / "empty.db").write_bytes(b"")
    (stores / "text.db").write_text("this is not a database\n")
    (stores / "random.db").write_bytes(bytes(gen.integers(0, 256, 4096, dtype=np.uint8)))
    foreign = sqlite3.connect(stores / "foreign.db")
    foreign.execute("CREATE TABLE users (name TEXT)")
    foreign.commit()
    foreign.close()
    _store(stores / "labels_not_json.db", [_row(labels="{not json")])
    _store(stores / "labels_list.db", [_row(labels="[1, 2]")])
    _store(stores / "labels_nested.db", [_row(labels='{"defense": {"a": [1, {"b": 2}]}}')])
    _store(stores / "metrics_text.db", [_row(metrics='{"mse": "lots", "psnr": "high"}')])
    _store(stores / "metrics_not_json.db", [_row(metrics="nan nan")])
    _store(stores / "seconds_text.db", [_row(seconds="fast")])
    _store(stores / "kind_foreign.db", [_row(kind="<script>alert(1)</script>")])
    _store(stores / "modality_foreign.db", [_row(modality="<script>alert(1)</script>")])
    _store(stores / "spec_number.db", [_row(spec="42")])
    _store(stores / "extras_deep.db", [_row(extras="[" * 100000 + "]" * 100000)])
    _store(stores / "grid_text.db", [_row(grid="not png bytes")])
    _store(stores / "key_blob.db", [_row(key=b"\x00\x01")])
    _store(stores / "labels_missing.db", [_row(labels='{"attack_spec": "ig", "defense": "none"}')])
    _store(stores / "utility_missing.db", [_row(kind="utility", labels='{"defense": "none"}')])
    _store(stores / "image_metrics_text.db", [_row()], [("k1", 0, "{bad", None, None)])
    _store(stores / "image_idx_text.db", [_row()], [("k1", "zero", "{}", None, None)])
    _store(stores / "image_metrics_str.db", [_row()], [("k1", 0, '{"psnr": "x"}', None, None)])
    (stores / "dir.db").mkdir()
    corrupted = (stores / "labels_list.db").read_bytes()
    (stores / "truncated.db").write_bytes(corrupted[:len(corrupted) // 2])
    header_only = bytearray(corrupted)
    header_only[100:2000] = bytes(1900)
    (stores / "zeroed.db").write_bytes(bytes(header_only))

    # user model files and misc text files
    models = root / "models"
    models.mkdir()
    (models / "latin1.py").write_bytes("# caf\xe9\ndef Net():\n    pass\n".encode("latin-1"))
    (models / "nul.py").write_bytes(b"def Net():\x00\n    pass\n")
    (models / "syntax.py").write_text("def Net(:\n")
    (models / "notpy.txt").write_text("def Net(): pass\n")
    (models / "plain_file").write_text("x\n")
    (root / "afile").write_text("a file, not a folder\n")
    flower = root / "flower"
    (flower / "nopyproject").mkdir(parents=True)
    (flower / "badtoml").mkdir()
    (flower / "badtoml" / "pyproject.toml").write_text("[tool.flwr.app\ncomponents = 5\n")
    (flower / "latin1").mkdir()
    (flower / "latin1" / "pyproject.toml").write_bytes("name = 'caf\xe9'\n".encode("latin-1"))


# --------------------------------------------------------------------------- cases


NUMERIC_BAD = ("nan", "NaN", "inf", "-inf", "1e99", "-1e99", "1e400", "18446744073709551616", "abc", "0x10", "1,5",
               "٣", "1e99999999")
INT_ONLY_BAD = ("1.5", "2.000001")
TEXT_BAD = ("💥", "../../etc/passwd", "a" * 300, "<script>", "\u202e", "none;none")


def _option_fields():
    """(kind, name, field, annotation) for every option of every registered attack, defense and model."""
    from gradleak.attacks import ATTACKS
    from gradleak.defenses import DEFENSES
    from gradleak.models import MODELS

    found = []
    for kind, registry in (("attack", ATTACKS), ("defense", DEFENSES)):
        for name in registry.names():
            try:
                options = registry.get(name).Options
            except Exception:  # a component that cannot load is not fuzzed here
                continue
            if options is None:
                continue
            hints = typing.get_type_hints(options)
            found += [(kind, name, f.name, hints[f.name]) for f in dataclasses.fields(options) if f.init]
    import importlib

    for name in MODELS.names():
        builder = MODELS.get(name)
        module = importlib.import_module(builder.__module__)
        for obj in vars(module).values():
            if dataclasses.is_dataclass(obj) and isinstance(obj, type) and obj.__name__.endswith("Options"):
                hints = typing.get_type_hints(obj)
                found += [("model", name, f.name, hints[f.name]) for f in dataclasses.fields(obj) if f.init]
                break
    return found


def _kind_of(annotation) -> str:
    from typing import Literal, get_args, get_origin

    if annotation is bool:
        return "bool"
    if annotation in (int, float):
        return annotation.__name__
    origin = get_origin(annotation)
    if origin is Literal:
        return "literal"
    args = [a for a in get_args(annotation) if a is not type(None) and a is not Ellipsis]
    if origin is not None and args:
        inner = _kind_of(args[0])
        return inner if origin is not tuple and origin is not list else f"tuple-{inner}"
    return "other"


def _option_cases() -> list[Case]:
    cases = []
    for kind, name, field, annotation in _option_fields():
        ftype = _kind_of(annotation)
        if ftype in ("int", "float", "tuple-int", "tuple-float"):
            values = NUMERIC_BAD + (INT_ONLY_BAD if "int" in ftype else ())
        elif ftype == "bool":
            values = ("maybe", "2", "💥", "nan")
        elif ftype == "literal":
            values = TEXT_BAD[:4]
        else:
            continue
        for value in values:
            spec = f"{name}:{field}={value}"
            if kind == "attack":
                argv = _replace(BASE_ATTACK, "--attack", spec)
            elif kind == "defense":
                argv = BASE_ATTACK + ["--defense", spec]
            else:
                argv = _replace(BASE_IMAGE_ATTACK, "--model", spec)
            cases.append(Case(f"option-{kind}-{name}-{field}-{value[:12]}", tuple(argv), field))
    return cases


# numeric flags of each sub-command, on a base command line that is otherwise valid
FLAG_BASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "attack": (BASE_ATTACK, {"--batch-size": "int", "--local-steps": "int", "--local-epochs": "int",
                             "--local-batch-size": "int", "--lr": "float", "--images": "int", "--seed": "int",
                             "--pretrain-steps": "int", "--resize": "int"}),
    "audit": (["audit", "--dataset", TAB, "--model", "mlp:hidden=8", "--attack", "dlg:iterations=1",
               "--lpips", "none", "--json", "--out", "{O}/audit"],
              {"--batch-size": "int", "--local-steps": "int", "--local-epochs": "int", "--local-batch-size": "int",
               "--lr": "float", "--images": "int", "--seed": "int", "--resize": "int"}),
    "utility": (["utility", "--dataset", "digits", "--model", "mlp:hidden=8", "--rounds", "1", "--clients", "2",
                 "--per-round", "1", "--json"],
                {"--clients": "int", "--per-round": "int", "--rounds": "int", "--dirichlet": "float",
                 "--local-steps": "int", "--local-epochs": "int", "--local-batch-size": "int", "--lr": "float",
                 "--delta": "float", "--seed": "int"}),
    "bound": (["bound", "--d", "4", "--m", "8", "--noise", "0.1", "--json"],
              {"--d": "int", "--m": "int", "--batch-size": "int", "--noise": "float", "--epsilon": "float",
               "--delta": "float", "--seed": "int"}),
    "demo": (["demo", "--json", "--out", "{O}/demo", "--workers", "1"], {"--workers": "int"}),
    "train-postprocessor": (["train-postprocessor", "--out", "{O}/unet.safetensors", "--steps", "1"],
                            {"--steps": "int", "--seed": "int"}),
    "inspect-model": (["inspect-model", "--dataset", IMG, "--model", "convnet:width=2", "--attack", "rtf:bins=4",
                       "--json"], {"--batch-size": "int", "--resize": "int", "--seed": "int"}),
    "flower": (["flower", "{F}/flower/nopyproject", "--out", "{O}/flower"],
               {"--num-supernodes": "int", "--clients": "int"}),
    "sweep": (["sweep", "{F}/sweeps/ok.yaml", "--store", "{O}/s.db", "--json"], {"--workers": "int"}),
    "calibrate": (["calibrate", "{F}/sweeps/ok.yaml", "--defense", "noise", "--low", "0.1", "--high", "1",
                   "--store", "{O}/c.db", "--json"],
                  {"--low": "float", "--high": "float", "--factor": "float", "--workers": "int"}),
}
FLAG_BAD = ("nan", "inf", "-inf", "-1", "1e99", "-1e99", "18446744073709551616", "abc", "", "1e400", "0x5", "--",
            "1_000_000_000_000")

def _flag_cases() -> list[Case]:
    cases = []
    for command, (base, flags) in FLAG_BASES.items():
        for flag, kind in flags.items():
            values = FLAG_BAD + (("1.5",) if kind == "int" else ())
            for value in values:
                argv = _replace(base, flag, value) if flag in base else base + [flag, value]
                cases.append(Case(f"flag-{command}-{flag}-{value[:10]}", tuple(argv)))
    # values that are in range on their own but absurd together or at a boundary
    cases += [
        Case("bound-epsilon-subnormal", ("bound", "--d", "4", "--m", "8", "--noise", "0.1", "--epsilon", "1e-320"),
             "epsilon"),
        Case("bound-delta-one", ("bound", "--d", "4", "--m", "8", "--noise", "0.1", "--delta", "1"), "delta"),
        Case("bound-delta-zero", ("bound", "--d", "4", "--m", "8", "--noise", "0.1", "--delta", "0"), "delta"),
        Case("bound-too-large", ("bound", "--d", "100000", "--m", "1000000", "--noise", "0.1"), "large"),
        Case("bound-bad-defense", ("bound", "--d", "4", "--m", "8", "--noise", "0.1", "--defense", "bogus"), None),
        Case("bound-defense-option", ("bound", "--d", "4", "--m", "8", "--noise", "0.1", "--defense",
                                      "local:steps=1e99"), "steps"),
        Case("utility-dpsgd-sigma0", ("utility", "--dataset", "digits", "--model", "mlp:hidden=8", "--rounds", "1",
                                      "--clients", "2", "--per-round", "1", "--defense", "dpsgd:sigma=0"),
             "privacy"),
        Case("utility-per-round-above-clients", ("utility", "--clients", "2", "--per-round", "5"), "per-round"),
        Case("demo-workers-zero", ("demo", "--workers", "0", "--out", "{O}/demo"), "workers"),
        *(Case(f"sweep-workers-{value}", ("sweep", "{F}/sweeps/ok.yaml", "--store", "{O}/s.db", "--json",
                                          "--workers", value), "workers")
          for value in ("0", "1025", "100000", "-5", "2.5", "1e4")),
        Case("flower-rounds-zero", ("flower", "{F}/flower/nopyproject", "--rounds", "0"), "rounds"),
        Case("flower-rounds-text", ("flower", "{F}/flower/nopyproject", "--rounds", "a,b"), "rounds"),
        Case("flower-rounds-huge", ("flower", "{F}/flower/nopyproject", "--rounds", "1e99"), "rounds"),
        Case("flower-run-config", ("flower", "{F}/flower/nopyproject", "--run-config", "novalue"), "run-config"),
    ]
    return cases


def _name_cases() -> list[Case]:
    bad_names = ("bogus", "ig:=", "ig:lr", "ig:lr=1,lr=2", ":x", "ig:,", "ig:a=b", "💥", "../ig",
                 "ig:iterations=1;2", "", " ", "ig\x00", "a" * 5000, "ig:lr=1:2", "dlg:iterations=-1")
    cases = []
    for i, name in enumerate(bad_names):
        cases.append(Case(f"name-attack-{i}", tuple(_replace(BASE_ATTACK, "--attack", name))))
        cases.append(Case(f"name-defense-{i}", tuple(BASE_ATTACK + ["--defense", name.replace("ig", "noise")])))
        cases.append(Case(f"name-model-{i}", tuple(_replace(BASE_ATTACK, "--model",
                                                            name.replace("ig", "mlp").replace("lr", "hidden")))))
        cases.append(Case(f"name-dataset-{i}", tuple(_replace(BASE_ATTACK, "--dataset",
                                                              name.replace("ig", "digits")))))
        cases.append(Case(f"name-audit-attack-{i}", ("audit", "--dataset", TAB, "--model", "mlp:hidden=8",
                                                     "--attack", name, "--out", "{O}/a", "--json")))
        cases.append(Case(f"name-utility-defense-{i}", ("utility", "--defense", name.replace("ig", "noise"),
                                                        "--rounds", "1", "--json")))
    for value in ("mps", "hpu", "meta", "lazy", "xla", "cuda:999", "cuda:-1", "cpu:0", "CPU;rm", "", "vulkan",
                  "cuda:1e9", "ipu", "mtia", "privateuseone"):
        cases.append(Case(f"device-attack-{value}", tuple(BASE_ATTACK + ["--device", value]), "device"))
        cases.append(Case(f"device-audit-{value}", ("audit", "--dataset", TAB, "--model", "mlp:hidden=8", "--attack",
                                                    "dlg:iterations=1", "--out", "{O}/a", "--device", value),
                          "device"))
    for option in ("resize=1", "resize=100000", "resize=-3", "resize=abc", "crop=0", "crop=99999", "channels=7",
                   "path=/nonexistent", "bogus=1", "resize=1e99", "crop=1.5"):
        cases.append(Case(f"dataset-option-{option}", tuple(_replace(BASE_IMAGE_ATTACK, "--dataset",
                                                                     f"image-folder:path={{F}}/images/empty,{option}"))))
        cases.append(Case(f"dataset-option-mnist-{option}", tuple(_replace(BASE_IMAGE_ATTACK, "--dataset",
                                                                           f"mnist:{option}"))))
    for value in ("1", "2", "4", "100000", "1025"):
        cases.append(Case(f"resize-{value}", tuple(BASE_IMAGE_ATTACK + ["--resize", value]), "resize"))
    for spec in ("convnet:width=100000", "convnet:width=4000", "mlp:hidden=100000;100000", "twolayer:width=1000000",
                 "lenet:width=1000000", "resnet18:width=1000", "vgg16:width_divisor=0", "lenet-rog:hidden=1000000",
                 "convnet:width=0", "convnet:width=-5", "mlp:hidden=0", "resnet20:width=100000"):
        cases.append(Case(f"model-size-{spec}", tuple(_replace(BASE_IMAGE_ATTACK, "--model", spec))))
    # MKOR's declared ranges, where the name-based defaults (±10⁶) would let a value through
    for option in ("smooth=0", "smooth=65", "smooth=100000", "shifts=-2", "shifts=101", "shifts=100000",
                   "noise=-0.1", "noise=1", "noise=5", "anchor_prob=-0.5", "anchor_prob=1", "anchor_prob=1000"):
        cases.append(Case(f"mkor-option-{option}", tuple(_replace(BASE_IMAGE_ATTACK, "--attack", f"mkor:{option}")
                                                         + ["--threat", "malicious"]), option.partition("=")[0]))
    cases.append(Case("precode-bottleneck", tuple(BASE_IMAGE_ATTACK + ["--defense", "precode:bottleneck=100000000"]),
                      "bottleneck"))
    cases.append(Case("precode-bottleneck-memory", tuple(_replace(BASE_IMAGE_ATTACK, "--model", "convnet:width=64")
                                                         + ["--defense", "precode:bottleneck=1000000"]),
                      "precode"))
    return cases


def _file_cases() -> list[Case]:
    cases = []
    tensor_files = ("nan.npz", "inf.npz", "object.npz", "strings.npz", "mismatch.npz", "nolabels.npz",
                    "neglabels.npz", "fraclabels.npz", "hugelabels.npz", "empty.npz", "scalar.npz", "5d.npz",
                    "range.npz", "complex.npz", "garbage.npz", "empty_file.npz", "text.npz", "truncated.npz",
                    "truncated.safetensors", "hugeheader.safetensors", "badjson.safetensors", "overlap.safetensors",
                    "keys.safetensors", "payload.pt", "exec.pt", "truncated.pt", "random.pt", "list.pt",
                    "textinputs.pt", "dir.npz", "latin1.pt", "absent.npz")
    for name in tensor_files:
        for command in ("attack", "audit"):
            argv = _replace(BASE_ATTACK, "--dataset", f"{{F}}/tensors/{name}")
            if command == "audit":
                argv = ["audit"] + argv[1:] + ["--out", "{O}/a"]
            cases.append(Case(f"tensor-{command}-{name}", tuple(argv)))
        cases.append(Case(f"tensor-spec-{name}", tuple(_replace(BASE_ATTACK, "--dataset",
                                                                f"tensors:path={{F}}/tensors/{name}"))))
    for name in ("truncated", "truncated_idat", "zero", "text", "bomb", "badcrc", "nul", "jpeg_garbage", "empty",
                 "noimages"):
        for split in ("test", "train"):
            cases.append(Case(f"images-{name}-{split}",
                              tuple(_replace(BASE_IMAGE_ATTACK, "--dataset", f"{{F}}/images/{name}/")
                                    + ["--split", split])))
            cases.append(Case(f"images-spec-{name}-{split}",
                              tuple(_replace(BASE_IMAGE_ATTACK, "--dataset",
                                             f"image-folder:path={{F}}/images/{name}") + ["--split", split])))
    for name in ("overflow", "overflow64", "zero_dims", "badmagic", "truncated", "floats", "labels_mismatch",
                 "bad_gzip", "empty_file", "missing"):
        cases.append(Case(f"idx-{name}", tuple(_replace(BASE_IMAGE_ATTACK, "--dataset",
                                                        f"mnist-idx:path={{F}}/idx/{name}"))))
        cases.append(Case(f"idx-resize-{name}", tuple(_replace(BASE_IMAGE_ATTACK, "--dataset",
                                                               f"mnist-idx:path={{F}}/idx/{name},resize=8"))))
    for name in ("nan", "nested", "dict_labels", "nan_labels", "str_labels", "int_names", "dict_names", "few_names",
                 "wrong_shape", "not_dict", "missing_key", "payload", "exec_payload", "truncated", "latin1",
                 "data_list", "neg_labels", "bool_labels", "empty"):
        cases.append(Case(f"cifar-{name}", tuple(_replace(BASE_IMAGE_ATTACK, "--dataset",
                                                          f"cifar-batches:path={{F}}/cifar/{name}"))))
        cases.append(Case(f"cifar-audit-{name}", ("audit", "--dataset", f"cifar-batches:path={{F}}/cifar/{name}",
                                                  "--model", "convnet:width=2", "--attack", "dlg:iterations=1",
                                                  "--out", "{O}/a")))
    for name in ("payload.pt", "exec.pt", "random.pt", "empty.pt", "random.safetensors", "hugeheader.safetensors",
                 "wrong_keys.pt", "list.pt", "text_values.pt", "wrong.safetensors", "dir.pt", "latin1.pt", "absent.pt"):
        cases.append(Case(f"checkpoint-{name}", tuple(BASE_ATTACK + ["--checkpoint", f"{{F}}/ckpt/{name}"])))
        cases.append(Case(f"checkpoint-image-{name}", tuple(BASE_IMAGE_ATTACK + ["--checkpoint",
                                                                                  f"{{F}}/ckpt/{name}"])))
    for ref in ("latin1.py:Net", "nul.py:Net", "syntax.py:Net", "notpy.txt:Net", "plain_file:Net", "absent.py:Net",
                "latin1.py", "syntax.py:Net:width=1e99"):
        cases.append(Case(f"usermodel-{ref}", tuple(_replace(BASE_ATTACK, "--model", f"{{F}}/models/{ref}"))))
    for name in ("latin1.yaml", "nul.yaml", "nested.yaml", "nested_map.yaml", "empty.yaml", "list.yaml",
                 "scalar.yaml", "bad_yaml.yaml", "bogus_defense.yaml", "number_defense.yaml", "negative_seed.yaml",
                 "python_tag.yaml", "anchors.yaml", "dir.yaml", "binary.yaml", "absent.yaml", "utf16.yaml",
                 "device_mps.yaml", "device_number.yaml", "device_cuda99.yaml", "device_list.yaml",
                 "device_injected.yaml", "number_lr_nan.yaml", "number_lr_huge.yaml", "number_steps_huge.yaml",
                 "number_batch_huge.yaml", "number_seed_huge.yaml", "number_lr_text.yaml", "grid_huge.yaml",
                 "last_model_negative.yaml", "last_model_text.yaml", "last_dataset_resize.yaml", "last_checkpoint.yaml",
                 "last_activation.yaml", "last_defenses_type.yaml", "last_knows_type.yaml", "last_too_few.yaml",
                 "last_threat.yaml", "last_utility_model.yaml"):
        expected = "device" if name.startswith("device_") else None
        cases.append(Case(f"sweep-{name}", ("sweep", f"{{F}}/sweeps/{name}", "--store", "{O}/s.db", "--json",
                                            "--workers", "1"), expected))
    for name in ("empty.db", "text.db", "random.db", "foreign.db", "labels_not_json.db", "labels_list.db",
                 "labels_nested.db", "metrics_text.db", "metrics_not_json.db", "seconds_text.db", "kind_foreign.db",
                 "modality_foreign.db",
                 "spec_number.db", "extras_deep.db", "grid_text.db", "labels_missing.db", "utility_missing.db",
                 "image_metrics_text.db",
                 "image_idx_text.db", "image_metrics_str.db", "dir.db", "truncated.db", "zeroed.db", "absent.db"):
        for flags in ((), ("--json",)):
            cases.append(Case(f"store-{name}{''.join(flags)}", ("report", "--store", f"{{F}}/stores/{name}", "--out",
                                                                 "{O}/report", *flags)))
        cases.append(Case(f"store-sweep-{name}", ("sweep", "{F}/sweeps/empty.yaml", "--store",
                                                  f"{{F}}/stores/{name}")))
    for app in ("nopyproject", "badtoml", "latin1", "absent"):
        cases.append(Case(f"flower-{app}", ("flower", f"{{F}}/flower/{app}", "--out", "{O}/flower")))
    return cases


def _path_cases() -> list[Case]:
    long_name = "x" * 300
    bad_outs = (("file", "{F}/afile"), ("under-file", "{F}/afile/sub"), ("long-name", f"{{O}}/{long_name}"),
                ("long-path", "{O}/" + "/".join(["abcdefgh"] * 600)), ("nul", "{O}/a\x00b"), ("empty", ""))
    cases = []
    for label, out in bad_outs:
        cases.append(Case(f"out-attack-{label}", tuple(BASE_ATTACK + ["--out", out])))
        cases.append(Case(f"out-audit-{label}", ("audit", "--dataset", TAB, "--model", "mlp:hidden=8", "--attack",
                                                 "dlg:iterations=1", "--out", out)))
        cases.append(Case(f"out-report-{label}", ("report", "--store", "{F}/stores/labels_list.db", "--out", out)))
        cases.append(Case(f"out-demo-{label}", ("demo", "--out", out, "--workers", "1")))
        cases.append(Case(f"out-bound-study-{label}", ("bound-study", "--out", out, "--quick")))
        cases.append(Case(f"out-flower-{label}", ("flower", "{F}/flower/nopyproject", "--out", out)))
        cases.append(Case(f"out-train-postprocessor-{label}", ("train-postprocessor", "--out",
                                                               out if label != "file" else "{F}", "--steps", "1")))
        cases.append(Case(f"out-sweep-store-{label}", ("sweep", "{F}/sweeps/ok.yaml", "--json", "--workers", "1",
                                                        "--store", out if label != "file" else "{F}"), "store"))
    # input paths the file system cannot look up: one line naming what they were for
    for label, path in (("long-name", f"{{O}}/{long_name}"), ("long-path", "{O}/" + "/".join(["abcdefgh"] * 600))):
        for case_id, argv, what in (
                ("checkpoint", BASE_ATTACK + ["--checkpoint", path + ".pt"], "checkpoint"),
                ("dataset", _replace(BASE_ATTACK, "--dataset", path + ".npz"), "dataset"),
                ("dataset-spec", _replace(BASE_ATTACK, "--dataset", f"tensors:path={path}.npz"), "dataset"),
                ("image-folder", _replace(BASE_IMAGE_ATTACK, "--dataset", f"image-folder:path={path}"), "dataset"),
                ("model", _replace(BASE_ATTACK, "--model", path + ".py:Net"), "model"),
                ("sweep", ["sweep", path + ".yaml", "--store", "{O}/s.db"], "sweep"),
                ("store", ["report", "--store", path + ".db", "--out", "{O}/r"], "store"),
                ("flower", ["flower", path, "--out", "{O}/f"], "flower")):
            cases.append(Case(f"in-{case_id}-{label}", tuple(argv), what))
    return cases


def _argv_cases(rng: random.Random) -> list[Case]:
    commands = list(FLAG_BASES) + ["list", "report", "bound-study"]
    tokens = ["--json", "--out", "--bogus", "-x", "--", "💥", "--help=1", "--seed", "--dataset", "--model", "=",
              "--lr=", "--lr=nan", "--attack=", "\u202e", "-", "--store", "%s%n", "{}", "[]", "None", "--quick=1"]
    cases = [Case("argv-empty", ()), Case("argv-unknown-command", ("bogus",)), Case("argv-list-kind", ("list", "x")),
             Case("argv-list-extra", ("list", "attacks", "models"))]
    for command in commands:
        cases.append(Case(f"argv-{command}-bare", (command, "--bogus-flag")))
    for i in range(120):
        command = rng.choice(commands)
        argv = [command] + [rng.choice(tokens) for _ in range(rng.randint(1, 5))]
        if command not in ("list",):
            argv.append("--definitely-not-a-flag")  # always invalid, whatever the other tokens
        cases.append(Case(f"argv-random-{i}", tuple(argv)))
    return cases


def generate_cases() -> list[Case]:
    rng = random.Random(SEED)
    cases = _option_cases() + _flag_cases() + _name_cases() + _file_cases() + _path_cases() + _argv_cases(rng)
    seen, unique = set(), []
    for case in cases:
        if case.id not in seen:
            seen.add(case.id)
            unique.append(case)
    return unique


def subprocess_sample(cases: list[Case], count: int = 20) -> list[Case]:
    """A fixed, spread-out sample (every kind of case) to run as real processes."""
    # the OS refuses a NUL byte in a process's arguments: such cases run in process only
    picks = [c for c in cases if c.xfail is None and not any("\x00" in a for a in c.argv)]
    wanted = ("tensor-attack-payload.pt", "cifar-payload", "checkpoint-payload.pt", "store-labels_not_json.db",
              "images-truncated-test", "idx-overflow", "device-attack-mps", "out-attack-file",
              "bound-epsilon-subnormal", "utility-dpsgd-sigma0", "model-size-convnet:width=100000",
              "argv-empty", "cifar-nested", "flag-attack---seed-1844674407")
    chosen = [c for c in picks if c.id in wanted]
    rng = random.Random(SEED + 1)
    rest = [c for c in picks if c not in chosen]
    return chosen + rng.sample(rest, max(0, count - len(chosen)))
