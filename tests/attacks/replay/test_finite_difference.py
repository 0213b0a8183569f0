"""The frozen-kink finite difference (`attacks.replay.finite_difference`) must give the
same update and, up to its O(h) error, the same gradient of the update distance
as autograd's exact second derivative — for every registered model it accepts —
and fall back to the exact path where it does not apply."""
import dataclasses

import pytest
import torch
from torch import nn

from gradleak.attacks.replay import finite_difference
from gradleak.attacks.replay.matching import UpdateSimulator, update_distance
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models import MODELS, ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, run_attack
from gradleak.threat import make_threat_model, observe

SHAPES = {"lenet": (1, 16, 16), "lenet5": (1, 28, 28), "lenet-rog": (3, 32, 32), "mlp": (1, 12, 12),
          "convnet": (3, 16, 16), "resnet20": (3, 16, 16), "resnet18": (3, 16, 16),
          "vgg16": (3, 32, 32), "twolayer": (1, 8, 8)}
# plain VGG-16 at initialisation passes an input gradient of ~1e-11, float32 noise
# on either path; its batch-norm variant has the same kinks and a usable gradient
OPTIONS = {"convnet": {"width": 16}, "vgg16": {"batchnorm": True, "width_divisor": 4}}
# Models that read integer token ids: a candidate input has no gradient to difference, so the
# simulator must keep the exact path (test_token_models_keep_the_exact_path).
TOKEN_MODELS = {"gpt2": (8,), "minilm": (8,)}
TOKEN_OPTIONS = {"gpt2": {"width": 32, "heads": 4}, "minilm": {"pretrained": False, "layers": 1}}


def _observation(name: str, training=TrainingSpec(lr=0.1), batch: int = 3, activation=None):
    shape = SHAPES[name]
    model = build_model(ModelSpec(name, shape, 10, activation=activation, seed=0,
                                  options=OPTIONS.get(name, {})))
    gen = torch.Generator().manual_seed(1)
    x = torch.rand((batch, *shape), generator=gen)
    y = torch.randint(10, (batch,), generator=gen)
    obs = observe(compute_update(model, x, y, training), model, make_threat_model("honest"),
                  input_shape=shape, num_classes=10, training=training, batch_size=batch, labels=y,
                  defenses=[], modality="image")
    return obs, torch.rand(x.shape, generator=gen), y


def _distance_grads(sim: UpdateSimulator, candidate, labels):
    x = candidate.clone().requires_grad_(True)
    labels = labels.clone().requires_grad_(labels.dtype.is_floating_point)
    update = sim(x, labels)
    distance = update_distance(update, sim.target, "cosine") + update_distance(update, sim.target, "l2")
    inputs = [x, labels] if labels.requires_grad else [x]
    return {n: t.detach() for n, t in update.items()}, torch.autograd.grad(distance, inputs)


def _cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0))


def test_every_registered_model_is_covered():
    assert set(SHAPES) | set(TOKEN_MODELS) == set(MODELS.names()), "add new models to SHAPES or TOKEN_MODELS"


@pytest.mark.parametrize("name", list(TOKEN_MODELS))
def test_token_models_keep_the_exact_path(name):
    shape = TOKEN_MODELS[name]
    model = build_model(ModelSpec(name, shape, 10, seed=0, options=TOKEN_OPTIONS[name]))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(1000, (3, *shape), generator=gen), torch.randint(10, (3,), generator=gen)
    x[:, 0] = 101  # minilm reads WordPiece rows, which start with [CLS]
    training = TrainingSpec(lr=0.1)
    obs = observe(compute_update(model, x, y, training), model, make_threat_model("honest"), input_shape=shape,
                  num_classes=10, training=training, batch_size=3, labels=y, defenses=[], modality="text")
    assert not finite_difference.supports(model)
    for second_order in ("auto", "difference"):
        assert UpdateSimulator(obs, second_order=second_order).differenced is None


@pytest.mark.parametrize("name", list(SHAPES))
def test_difference_matches_exact_second_derivative(name):
    obs, candidate, y = _observation(name)
    exact = UpdateSimulator(obs)
    differenced = UpdateSimulator(obs, second_order="difference")
    assert differenced.differenced is not None, f"{name} should be supported"
    soft = torch.softmax(torch.randn(len(y), 10, generator=torch.Generator().manual_seed(2)), -1)
    for labels in (y, soft):  # hard labels (IG, CPL) and DLG's optimised soft labels
        update_e, grads_e = _distance_grads(exact, candidate, labels)
        update_d, grads_d = _distance_grads(differenced, candidate, labels)
        for n in update_e:
            torch.testing.assert_close(update_d[n], update_e[n], rtol=1e-4, atol=1e-6)
        for g_e, g_d in zip(grads_e, grads_d):
            assert _cosine(g_d, g_e) >= 0.9998, (name, _cosine(g_d, g_e))
            assert float(g_d.norm() / g_e.norm()) == pytest.approx(1, abs=0.01)


def test_leaky_relu_slopes_are_frozen_too():
    obs, candidate, y = _observation("convnet", activation="leakyrelu")
    exact = _distance_grads(UpdateSimulator(obs), candidate, y)[1][0]
    differenced = _distance_grads(UpdateSimulator(obs, second_order="difference"), candidate, y)[1][0]
    assert _cosine(differenced, exact) >= 0.9998


def test_kinks_must_be_frozen():
    # the same difference with the ReLU masks and max-pool choices re-evaluated at the
    # moved weights: units crossing zero add an O(1) error that no step size removes
    obs, candidate, y = _observation("convnet", batch=4)
    exact = _distance_grads(UpdateSimulator(obs), candidate, y)[1][0]
    sim = UpdateSimulator(obs, second_order="difference")
    frozen = _distance_grads(sim, candidate, y)[1][0]
    record_and_replay = sim.differenced.gradients
    sim.differenced.gradients = lambda x, y, mode, **which: record_and_replay(x, y, "off", **which)
    thawed = _distance_grads(sim, candidate, y)[1][0]
    assert _cosine(frozen, exact) >= 0.9999
    assert _cosine(thawed, exact) < 0.9


def test_entry_weight_not_observed():
    # the first layer's weights withheld from the update: they do not move, and its
    # output still carries the input's graph
    obs, candidate, y = _observation("lenet")
    sent = {n: t for n, t in obs.update.tensors.items() if not n.startswith("0.")}
    obs = dataclasses.replace(obs, update=dataclasses.replace(obs.update, tensors=sent))
    differenced = UpdateSimulator(obs, second_order="difference")
    assert differenced.differenced.entry is not None and "0.weight" not in differenced.names
    grad_e = _distance_grads(UpdateSimulator(obs), candidate, y)[1][0]
    grad_d = _distance_grads(differenced, candidate, y)[1][0]
    assert _cosine(grad_d, grad_e) >= 0.9998


def test_tied_weights_move_in_every_layer_that_holds_them():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 10))
    model[3].weight = model[1].weight
    gen = torch.Generator().manual_seed(3)
    x, y = torch.rand(3, 1, 4, 4, generator=gen), torch.tensor([1, 2, 3])
    training = TrainingSpec(lr=0.1)
    obs = observe(compute_update(model, x, y, training), model, make_threat_model("honest"),
                  input_shape=(1, 4, 4), num_classes=10, training=training, batch_size=3, labels=y,
                  defenses=[], modality="image")
    candidate = torch.rand(x.shape, generator=gen)
    grad_e = _distance_grads(UpdateSimulator(obs), candidate, y)[1][0]
    grad_d = _distance_grads(UpdateSimulator(obs, second_order="difference"), candidate, y)[1][0]
    assert _cosine(grad_d, grad_e) >= 0.9998


class _TwoReaders(nn.Module):
    def __init__(self, shared: bool):
        super().__init__()
        self.a = nn.Conv2d(1, 4, 3)
        self.b = self.a if shared else nn.Conv2d(1, 4, 3)

    def forward(self, x):
        return (self.a(x) + self.b(x)).flatten(1)


@pytest.mark.parametrize("model, found", [
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 10)), nn.Conv2d),
    (nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), nn.Linear),
    (nn.Sequential(nn.Conv2d(1, 4, 3, padding="same"), nn.Flatten()), None),
    (nn.Sequential(nn.BatchNorm2d(1), nn.Conv2d(1, 4, 3), nn.Flatten()), None),
    (_TwoReaders(shared=False), None),
    (_TwoReaders(shared=True), None),
])
def test_entry_layer_only_where_one_plain_layer_reads_the_input(model, found):
    # the two-pair input gradient is right only if that layer's output carries
    # all of the input's influence and its backward is Wᵀδ folded back
    entry = finite_difference._entry_layer(model, (1, 8, 8))
    assert (type(entry.module) if entry else None) is found


class _GeluNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.GELU(), nn.Linear(16, 10))

    def forward(self, x):
        return self.body(x)


def test_falls_back_to_exact_where_it_does_not_apply():
    # a FedAvg delta: the mixed-derivative identity holds for one gradient only
    obs, _, _ = _observation("lenet", TrainingSpec(lr=0.1, local_steps=2, local_batch_size=2), batch=4)
    assert UpdateSimulator(obs, second_order="difference").differenced is None
    # a layer the recorder does not know (its kinks or curvature would be differenced blindly)
    model = _GeluNet()
    x, y = torch.rand(2, 1, 8, 8), torch.tensor([1, 2])
    obs = observe(compute_update(model, x, y, TrainingSpec(lr=0.1)), model, make_threat_model("honest"),
                  input_shape=(1, 8, 8), num_classes=10, training=TrainingSpec(lr=0.1), batch_size=2,
                  labels=y, defenses=[], modality="image")
    assert not finite_difference.supports(model)
    assert UpdateSimulator(obs, second_order="difference").differenced is None
    assert finite_difference.supports(build_model(ModelSpec("convnet", (3, 16, 16), 10, seed=0)))


def test_auto_differences_convolutional_models_only():
    # an MLP's iteration is fixed overhead, which the difference's second pass doubles
    obs, _, _ = _observation("mlp")
    assert UpdateSimulator(obs, second_order="auto").differenced is None
    obs, _, _ = _observation("lenet")
    assert UpdateSimulator(obs, second_order="auto").differenced is not None


@pytest.mark.slow
def test_ig_with_difference_reconstructs_as_well_as_exact():
    # ReLU ConvNet with max-pooling: every kink type the recorder freezes. Measured
    # 14.8 dB against 14.0 exact (600 iterations, two images: 16.4 vs 15.9 dB in
    # 27 vs 46 s); the width-64 benchmark setting: 24.65 vs 24.59 dB over four images
    def run(second_order):
        return run_attack(AttackRunSpec(
            dataset="cifar10", model="convnet:width=16", images=1, lpips="none", seed=0, bn_mode="eval",
            attack=f"ig:iterations=300,second_order={second_order}"))
    exact, differenced = run("exact"), run("difference")
    assert differenced.metrics["psnr"] >= 14, differenced.metrics
    assert differenced.metrics["psnr"] >= exact.metrics["psnr"] - 1, (differenced.metrics, exact.metrics)
