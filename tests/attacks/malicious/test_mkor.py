"""MKOR (Wang et al.): reconstruction quality on real images, the threat-model gate,
and inspect-model's verdict on MKOR vs honest and class-fishing models."""
from __future__ import annotations

import pytest
import torch

from gradleak.attacks import ATTACKS
from gradleak.attacks.malicious.mkor import MKOROptions
from gradleak.attacks.malicious.mkor_decoding import sampled_pixels
from gradleak.commands.inspect_model import inspect_attack
from gradleak.data import load_dataset
from gradleak.data.references import dataset_spec
from gradleak.errors import GradleakError
from gradleak.metrics.image import psnr
from gradleak.run.batch_attack import attack_batch, one_per_class
from gradleak.run.experiment import AttackRunSpec, run_attack


def mnist_batch(mnist, seed: int, size: int = 100):
    idx = torch.randperm(len(mnist), generator=torch.Generator().manual_seed(1000 + seed))[:size]
    return mnist.inputs[idx], mnist.labels[idx]


@pytest.mark.parametrize("model,floor", [("lenet5", 0.27), ("lenet5:modified=true", 0.30)])
def test_lenet5_mnist_batch_100(mnist_test, model, floor):
    ssims = [attack_batch("mkor", model, *mnist_batch(mnist_test, b), 10, seed=b).metrics["ssim"] for b in range(2)]
    assert sum(ssims) / 2 >= floor, ssims


def test_lenet5_modified_is_exact_where_it_samples(mnist_test):
    # nine distinct labels: the tenth is absent, which pins the batch sum exactly
    idx = [int((mnist_test.labels == c).nonzero()[0]) for c in range(9)]
    x, y = mnist_test.inputs[idx], mnist_test.labels[idx]
    r = attack_batch("mkor", "lenet5:modified=true", x, y, 10)
    window = (slice(None), slice(None), slice(4, 24), slice(4, 24))  # the 20×20 pixels the 400 features see
    mse = (r.aligned[window] - x[window]).pow(2).mean()
    assert 10 * torch.log10(1 / mse.clamp(min=1e-12)) >= 60


@pytest.fixture(scope="module")
def cifar64():
    data = load_dataset(dataset_spec("cifar100", "test", 64))
    return one_per_class(data.inputs, data.labels)


def test_vgg16_cifar100_bounds(cifar64):
    x, y = cifar64
    r = attack_batch("mkor", "vgg16", x, y, 100)
    # PSNR of the mean MSE, seeds 0-4: 16.81 dB (the seed barely moves MKOR); per-image 13.1-28.1 dB
    assert r.metrics["ssim"] >= 0.45 and r.metrics["psnr"] >= 16, r.metrics


@pytest.mark.slow
def test_vgg16_cifar100_at_paper_resolution():
    # the official code resizes CIFAR-100 to 224×224; 18 of the 20 samples have distinct labels
    data = load_dataset(dataset_spec("cifar100", "test", 224))
    x, y = one_per_class(data.inputs, data.labels)
    r = attack_batch("mkor", "vgg16", x, y, 100)
    # Wang et al. Tab. 3. PSNR of the mean MSE, seeds 0-2: 24.23 dB (per-image 19.7-37.6, mean 26.15)
    assert r.metrics["ssim"] >= 0.87 and r.metrics["psnr"] >= 24, r.metrics


def test_vgg16_modified_samples_exactly(cifar64):
    x, y = cifar64
    r = attack_batch("mkor", "vgg16:modified=true", x, y, 100)
    mask = sampled_pixels(r.server_secrets.plan, tuple(x.shape[-2:]))
    assert float(psnr(x[..., mask], r.aligned[..., mask]).mean()) >= 60
    # decode time is a benchmark target, not a test. PSNR of the mean MSE, seeds 0-4: 27.10 dB
    assert r.metrics["psnr"] >= 22 and r.metrics["ssim"] >= 0.8, r.metrics


def test_honest_threat_refuses_mkor():
    with pytest.raises(GradleakError, match="malicious"):
        run_attack(AttackRunSpec(dataset="mnist", model="lenet5", attack="mkor", batch_size=4,
                                 threat="honest", lpips="none"))


def test_mkor_runs_end_to_end_under_malicious_threat():
    result = run_attack(AttackRunSpec(dataset="mnist", model="lenet5", attack="mkor", batch_size=50,
                                      threat="malicious", lpips="none", device="cpu"))
    assert result.metrics["ssim"] >= 0.25


def test_bad_options_are_clear_errors():
    with pytest.raises(GradleakError):
        MKOROptions(anchor_prob=1.5)
    with pytest.raises(GradleakError, match="batch-norm"):
        attack_batch("mkor", "vgg16:batchnorm=true", torch.rand(2, 3, 32, 32), torch.tensor([0, 1]), 10)


def test_inspect_mkor_passes_the_papers_checks():
    report = inspect_attack("mnist", "lenet5", "mkor:noise=0.01", batch_size=8)
    flags = report["flags"]
    assert not flags["zero_weights"] and not flags["large_fc"] and not flags["changed_architecture"]
    assert not flags["dominant_sample"] and not flags["silent_samples"]
    assert report["max_sample_share"] <= 1.5 * report["honest_max_sample_share"]
    # without noise the copy/shift filters leave conv layers mostly exact zeros
    assert inspect_attack("mnist", "lenet5", "mkor", batch_size=4)["flags"]["zero_weights"]


@pytest.mark.skipif("fishing" not in ATTACKS, reason="class fishing not registered")
def test_inspect_flags_class_fishing():
    report = inspect_attack("mnist", "lenet5", "fishing", batch_size=8)
    assert report["suspicious"]
    assert report["flags"]["zero_weights"] or report["flags"]["dominant_sample"] or report["flags"]["silent_samples"]


def test_inspect_refuses_honest_attacks():
    with pytest.raises(GradleakError, match="not a malicious"):
        inspect_attack("mnist", "lenet5", "ig", batch_size=2)
