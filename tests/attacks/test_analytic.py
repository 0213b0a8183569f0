"""Analytic and malicious-server attacks: fc-analytic, rtf, fishing, cpa, tensor (small targets)."""
import math

import pytest
import torch
from scipy.optimize import linear_sum_assignment

from gradleak.attacks import AttackContext, make_attack
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec, compute_update
from gradleak.metrics import score_batch, summarize
from gradleak.models import ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, run_attack
from gradleak.solvers import tensor_features, tensor_features_from_first_layer
from gradleak.solvers.fc import locate_first_linear
from gradleak.solvers.features import FeatureExtractor
from gradleak.threat import make_threat_model, observe


def _observe(model, x, y, threat="honest"):
    update = compute_update(model, x, y, TrainingSpec())
    return observe(update, model, make_threat_model(threat), input_shape=tuple(x.shape[1:]),
                   num_classes=10, training=TrainingSpec(), batch_size=len(x), labels=y, defenses=[], modality="image")


def _mlp(width=256, seed=0):
    return build_model(ModelSpec("mlp", (1, 28, 28), 10, seed=seed, options={"hidden": (width,)}))


# ----------------------------------------------------------------------------- fc-analytic
def test_fc_analytic_is_exact_for_one_sample(mnist_test):
    for i in (0, 1):
        x, y = mnist_test.inputs[i:i + 1], mnist_test.labels[i:i + 1]
        rec = make_attack("fc-analytic").reconstruct(_observe(_mlp(), x, y), AttackContext())
        scores, _ = score_batch(x, y, rec.inputs, rec.labels, lpips="none", modality="image")
        assert scores[0].psnr > 60 and scores[0].recovered_label == int(y[0])


def test_fc_analytic_refuses_models_without_a_first_fc_layer(mnist_test):
    x, y = mnist_test.inputs[:1], mnist_test.labels[:1]
    lenet = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    with pytest.raises(GradleakError, match="fully connected"):
        make_attack("fc-analytic").reconstruct(_observe(lenet, x, y), AttackContext())


# ----------------------------------------------------------------------------- robbing the fed
def test_rtf_recovers_most_of_a_batch_of_64():
    result = run_attack(AttackRunSpec(dataset="mnist", model="lenet", attack="rtf:bins=512", batch_size=64,
                                      threat="malicious", lpips="none"))
    recovered = sum(1 for s in result.per_example if (s["psnr"] or 0) >= 40) / 64
    assert recovered >= 0.75, recovered
    # far fewer bins than samples: collisions dominate
    few = run_attack(AttackRunSpec(dataset="mnist", model="lenet", attack="rtf:bins=16", batch_size=64,
                                   threat="malicious", lpips="none"))
    assert sum(1 for s in few.per_example if (s["psnr"] or 0) >= 40) / 64 < recovered


def test_honest_threat_model_refuses_malicious_attacks():
    for attack in ("rtf", "fishing"):
        with pytest.raises(GradleakError, match="--threat malicious"):
            run_attack(AttackRunSpec(dataset="mnist", model="mlp", attack=attack, batch_size=2, lpips="none"))


# ----------------------------------------------------------------------------- fishing
def test_fishing_isolates_and_recovers_the_target_class(mnist_test):
    x, y = mnist_test.inputs[:8], mnist_test.labels[:8]  # labels 7 2 1 0 4 1 4 9: 7 occurs once
    target = int(y[0])
    assert int((y == target).sum()) == 1
    attack = make_attack(f"fishing:target_class={target}")
    model = attack.prepare_model(_mlp(), (1, 28, 28), 10, AttackContext()).model
    obs = _observe(model, x, y, "malicious")
    # the first layer's batch gradient is (up to the 1/B of the mean loss) the target sample's alone
    alone = compute_update(model, x[:1], y[:1], TrainingSpec()).tensors["1.weight"] / 8
    assert torch.allclose(obs.update.tensors["1.weight"], alone, atol=1e-6 * float(alone.abs().max()))
    rec = attack.reconstruct(obs, AttackContext())
    assert rec.labels.tolist() == [target]
    scores, _ = score_batch(x[:1], y[:1], rec.inputs, rec.labels, lpips="none", modality="image")
    assert scores[0].psnr > 60
    # without the malicious edit the same inversion only sees a mixture of the batch
    honest = make_attack("fc-analytic").reconstruct(_observe(_mlp(), x, y), AttackContext())
    mixed, _ = score_batch(x[:1], y[:1], honest.inputs[:1], None, lpips="none", modality="image")
    assert mixed[0].psnr < scores[0].psnr


def test_fishing_inverts_the_isolated_gradient_of_a_conv_first_model(mnist_test):
    x, y = mnist_test.inputs[:8], mnist_test.labels[:8]  # 7 occurs once
    attack = make_attack("fishing:target_class=7,iterations=300")
    lenet = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    model = attack.prepare_model(lenet, (1, 28, 28), 10, AttackContext()).model
    obs = _observe(model, x, y, "malicious")
    # every conv gradient is the target sample's alone (the head's zeroed rows still see all)
    alone = compute_update(model, x[:1], y[:1], TrainingSpec()).tensors
    for name in ("0.weight", "2.weight", "4.weight"):
        assert torch.allclose(obs.update.tensors[name], alone[name] / 8, atol=1e-6 * float(alone[name].abs().max()))
    rec = attack.reconstruct(obs, AttackContext())
    assert rec.extras == {"target_count": 1, "inversion": "ig"} and rec.labels.tolist() == [7]
    scores, _ = score_batch(x[:1], y[:1], rec.inputs, rec.labels, lpips="none", modality="image")
    assert scores[0].psnr >= 40, scores[0]


# ----------------------------------------------------------------------------- cocktail party
def test_cpa_separates_a_batch_of_32(mnist_test):
    x, y = mnist_test.inputs[:32], mnist_test.labels[:32]
    rec = make_attack("cpa").reconstruct(_observe(_mlp(256), x, y), AttackContext())
    summary = summarize(score_batch(x, y, rec.inputs, rec.labels, lpips="none", modality="image")[0])
    assert summary["ssim"] >= 0.6, summary


def test_cpa_without_bias_uses_skew_and_range(mnist_test):
    x, y = mnist_test.inputs[8:16], mnist_test.labels[8:16]
    model = build_model(ModelSpec("twolayer", (1, 28, 28), 10, seed=0, options={"width": 256}))
    rec = make_attack("cpa").reconstruct(_observe(model, x, y), AttackContext())
    summary = summarize(score_batch(x, y, rec.inputs, None, lpips="none", modality="image")[0])
    assert summary["ssim"] >= 0.8, summary
    # plain FastICA (no non-negative search) is clearly weaker on MNIST digits
    ica = make_attack("cpa:nonnegative=false").reconstruct(_observe(model, x, y), AttackContext())
    assert summarize(score_batch(x, y, ica.inputs, None, lpips="none", modality="image")[0])["ssim"] < summary["ssim"]


def test_feature_extractor_stops_at_the_first_linear_layer(mnist_test):
    model = build_model(ModelSpec("lenet5", (1, 28, 28), 10, activation="relu", seed=0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = mnist_test.inputs[:4]
    extract = FeatureExtractor(model, locate_first_linear(model, (1, 28, 28)).name)
    assert torch.equal(extract(x), model[:7](x))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_cpa_inverts_features_behind_convolutions(mnist_test):
    # lenet5 with ReLU: ICA + vertex search recover the 400-d features the first FC layer saw,
    # feature inversion through the known conv extractor turns them back into digits
    x, y = mnist_test.inputs[:8], mnist_test.labels[:8]
    model = build_model(ModelSpec("lenet5", (1, 28, 28), 10, activation="relu", seed=0))
    rec = make_attack("cpa:feature_steps=500").reconstruct(_observe(model, x, y), AttackContext())
    assert rec.extras["feature_layer"] == "7" and rec.extras["nonnegative_search"]
    summary = summarize(score_batch(x, y, rec.inputs, rec.labels, lpips="none", modality="image")[0])
    assert summary["ssim"] >= 0.75, summary


# ----------------------------------------------------------------------------- tensor method
def _synthetic_gradients(m, seed, d=20, B=5, activation=torch.relu):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(B, d, generator=gen)
    X = X / X.norm(dim=1, keepdim=True)
    y = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])[:B]
    W = torch.randn(m, d, generator=gen, requires_grad=True)
    a = torch.full((m,), 1.0 / m, requires_grad=True)
    loss = 0.5 * ((activation(X @ W.T) @ a - y) ** 2).sum()
    g_W, g_a = torch.autograd.grad(loss, [W, a])
    return X, W.detach(), g_a, g_W


def _feature_error(X, X_hat, signed=True):
    cost = torch.cdist(X, X_hat) ** 2
    if not signed:
        cost = torch.minimum(cost, torch.cdist(X, -X_hat) ** 2)
    rows, cols = linear_sum_assignment(cost.numpy())
    return math.sqrt(float(cost[rows, cols].mean()))


def test_tensor_method_error_falls_with_width():
    widths = (3000, 24000, 150000)
    errors = []
    for m in widths:
        per_seed = []
        for seed in (0, 1):
            X, W, g_a, _ = _synthetic_gradients(m, seed)
            X_hat = tensor_features(g_a, W, 5, "relu", generator=torch.Generator().manual_seed(seed))
            assert X_hat.shape == (5, 20)
            assert torch.allclose(X_hat.norm(dim=1), torch.ones(5), atol=1e-5)
            per_seed.append(_feature_error(X, X_hat))  # signs resolved: compared without sign freedom
        errors.append(sum(per_seed) / len(per_seed))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[-1] <= 0.1, errors


def test_tensor_method_from_first_layer_gradient():
    X, W, _, g_W = _synthetic_gradients(64000, 3)
    X_hat = tensor_features_from_first_layer(g_W, W, 5, "relu", generator=torch.Generator().manual_seed(0))
    assert _feature_error(X, X_hat) <= 0.1


def test_tensor_method_odd_activation_up_to_sign():
    X, W, g_a, _ = _synthetic_gradients(64000, 4, activation=torch.tanh)
    X_hat = tensor_features(g_a, W, 5, "tanh", generator=torch.Generator().manual_seed(0))
    assert _feature_error(X, X_hat, signed=False) <= 0.15


def test_tensor_method_rejects_bad_input():
    with pytest.raises(GradleakError, match="batch_size"):
        tensor_features(torch.zeros(100), torch.randn(100, 10), 11)
    with pytest.raises(GradleakError, match="unknown activation"):
        tensor_features(torch.zeros(100), torch.randn(100, 10), 2, "gelu")


def test_tensor_attack_on_twolayer_digits():
    def ssim_at(width):
        result = run_attack(AttackRunSpec(dataset="digits", model=f"twolayer:width={width},init=gaussian",
                                          attack="tensor", batch_size=4, lpips="none"))
        return result.metrics["ssim"]

    small, large = ssim_at(4000), ssim_at(100000)
    assert large > small and large >= 0.7, (small, large)
