"""ROG (paper 02): latent-space matching of FedAvg deltas, the signSGD variant,
the enhancement U-Net and the semantic-match metric. Thresholds are smaller
versions of the issue's targets, measured on this code (see docs/rog.md)."""
from __future__ import annotations

import skimage.data
import pytest
import torch
import torch.nn.functional as F

from gradleak.attacks import AttackContext, make_attack
from gradleak.data import DatasetSpec, load_dataset
from gradleak.defenses import make_chain
from gradleak.errors import GradleakError
from gradleak.experiment import AttackRunSpec, run_attack
from gradleak.fl import TrainingSpec, compute_update
from gradleak.metrics import psnr, score_batch, summarize
from gradleak.models import ModelSpec, build_model
from gradleak.threat import make_threat_model, observe


def test_rog_reconstructs_fedavg_delta_and_beats_ig():
    # 3 CIFAR-10 images, batch 1, τ = 3 local steps: measured ROG PSNR 19.6 /
    # LPIPS 0.32 vs IG (same 150 iterations, same per-iteration cost) LPIPS 0.58.
    common = dict(dataset="cifar10", model="lenet", batch_size=1, images=3, local_steps=3, lr=0.1)
    rog = run_attack(AttackRunSpec(attack="rog:iterations=150,scale=2,postprocess=false", **common))
    ig = run_attack(AttackRunSpec(attack="ig:iterations=150", **common))
    assert rog.metrics["psnr"] >= 17.0
    assert rog.metrics["lpips"] <= 0.40
    assert rog.metrics["lpips"] < ig.metrics["lpips"] - 0.1


def _sign_observation(dataset: str, n: int):
    data = load_dataset(DatasetSpec(dataset, split="test"))
    model = build_model(ModelSpec("lenet", data.input_shape, data.num_classes, seed=0))
    training = TrainingSpec(lr=0.1)
    x, y = data.inputs[:n], data.labels[:n]
    # signSGD upload through the registered defense (bare ±1 signs)
    update = compute_update(model, x, y, training, make_chain(["sign:scale=none"]))
    assert all(set(t.unique().tolist()) <= {-1.0, 0.0, 1.0} for t in update.tensors.values())
    obs = observe(update, model, make_threat_model("honest"), input_shape=data.input_shape,
                  num_classes=data.num_classes, training=training, batch_size=n, labels=y, defenses=[])
    return obs, x, y


def _lpips(attack: str, obs, x, y) -> float:
    rec = make_attack(attack).reconstruct(obs, AttackContext(seed=0))
    scores, _ = score_batch(x, y, rec.inputs, rec.labels, "image", "alex")
    return summarize(scores)["lpips"]


def test_rog_sign_recovers_from_sign_update_where_ig_fails():
    # Measured on the first CIFAR-10 test image: rog-sign LPIPS ≈ 0.41–0.47, IG 0.54.
    obs, x, y = _sign_observation("cifar10", 1)
    rog_sign = _lpips("rog-sign:iterations=300,scale=2,equalize=false", obs, x, y)
    ig = _lpips("ig:iterations=300", obs, x, y)
    assert rog_sign <= 0.50
    assert rog_sign < ig - 0.04


def test_rog_sign_normalisation_and_equalisation():
    attack = make_attack("rog-sign:equalize=true")
    # a low-contrast reconstruction, as sign matching gives (magnitudes are lost)
    x = 0.4 + 0.1 * torch.rand((2, 3, 8, 8), generator=torch.Generator().manual_seed(0))
    image, _ = attack.finish(x)
    assert image.min() >= 0 and image.max() <= 1
    # max-abs normalisation then equalisation spread every channel over [0, 1]
    spread = (image.flatten(2).amax(2) - image.flatten(2).amin(2))
    assert float(spread.min()) > 0.9
    plain, _ = make_attack("rog-sign:equalize=false").finish(x)
    assert torch.allclose(plain, x / x.flatten(1).amax(1).view(-1, 1, 1, 1))


def test_postprocessor_improves_held_out_image_over_bicubic():
    from gradleak.postprocess import enhance, load_enhancer

    net = load_enhancer()  # the shipped safetensors weights
    camera = torch.from_numpy(skimage.data.camera()).float().div(255)[None, None]  # never trained on
    image = F.interpolate(camera, size=(128, 128), mode="area")
    low = F.interpolate(image, scale_factor=0.25, mode="bicubic", antialias=True)
    upsampled = F.interpolate(low, size=(128, 128), mode="bicubic").clamp(0, 1)
    enhanced = enhance(upsampled, net)
    assert enhanced.shape == image.shape
    # measured: bicubic 23.39 dB, U-Net 24.21 dB
    assert float(psnr(enhanced, image)) > float(psnr(upsampled, image)) + 0.4


def test_postprocessor_rejects_bad_weights(tmp_path):
    from gradleak.postprocess import load_enhancer

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(GradleakError):
        load_enhancer(bad)
    with pytest.raises(GradleakError):
        load_enhancer(tmp_path / "missing.safetensors")


def test_semantic_match_with_a_trained_classifier(mnist_test):
    from gradleak.metrics.semantic import semantic_match

    torch.manual_seed(0)
    classifier = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    optimizer = torch.optim.Adam(classifier.parameters(), lr=0.01)
    x, y = mnist_test.inputs[:1000], mnist_test.labels[:1000]
    for _ in range(100):
        optimizer.zero_grad()
        F.cross_entropy(classifier(x), y).backward()
        optimizer.step()
    held_x, held_y = mnist_test.inputs[1000:1200], mnist_test.labels[1000:1200]
    assert semantic_match(classifier, held_x, held_y) > 0.8
    noise = torch.rand(held_x.shape, generator=torch.Generator().manual_seed(0))
    assert semantic_match(classifier, noise, held_y) < 0.3


def test_rog_options_validated():
    with pytest.raises(GradleakError):
        make_attack("rog:scale=0")
    with pytest.raises(GradleakError):
        make_attack("rog-sign:tanh_scale=cube")
    with pytest.raises(GradleakError):
        make_attack("rog:iterations=0")
