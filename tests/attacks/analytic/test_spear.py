"""SPEAR: exact batch inversion of a dense+ReLU layer's gradient (adult, MNIST, conv features)."""
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from gradleak.api import select_attacks
from gradleak.attacks import AttackContext, make_attack
from gradleak.attacks.analytic.spear_core import settled
from gradleak.data import DatasetSpec, load_dataset
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models import ModelSpec, build_model
from gradleak.solvers.features import FeatureExtractor
from gradleak.threat import make_threat_model, observe


@pytest.fixture(scope="module")
def adult():
    return load_dataset(DatasetSpec("adult", split="test"))


def _batch(data, size, seed):
    index = torch.randperm(len(data.inputs), generator=torch.Generator().manual_seed(seed))[:size]
    return data.inputs[index].float(), data.labels[index]


def _observe(model, x, y, num_classes, modality="image"):
    update = compute_update(model, x, y, TrainingSpec())
    return observe(update, model, make_threat_model("honest"), input_shape=tuple(x.shape[1:]),
                   num_classes=num_classes, training=TrainingSpec(), batch_size=len(x), labels=y, defenses=[],
                   modality=modality)


def _matched_errors(recovered, original):
    """Per original example, the mean squared error of the recovered row assigned to it."""
    cost = torch.cdist(recovered.flatten(1).double(), original.flatten(1).double()) ** 2 / original[0].numel()
    rows, cols = linear_sum_assignment(cost.numpy())
    return cost[rows, cols], rows, cols


def test_spear_recovers_adult_batches_of_8_exactly(adult):
    # seeds 0-2: every record exact, MSE ≤ 6e-17 (benchmarks/attacks/bench_spear.py: 10/10 other batches exact)
    for seed in range(3):
        x, y = _batch(adult, 8, seed)
        model = build_model(ModelSpec("mlp", tuple(x.shape[1:]), 2, seed=seed))
        rec = make_attack("spear").reconstruct(_observe(model, x, y, 2, "tabular"), AttackContext(seed=seed))
        errors, rows, cols = _matched_errors(rec.inputs, x)
        assert rec.converged and len(rec.inputs) == 8
        assert float(errors.max()) <= 1e-6, (seed, errors)
        # each example's label from its own ∂L/∂Z column
        assert rec.labels[rows].tolist() == y[cols].tolist()


def test_spear_recovers_an_mnist_mlp_batch_of_16_exactly(mnist_test):
    # seeds 0 and 1: 16/16 exact, MSE ≤ 6e-16 (benchmark: 6/6 other batches exact, median 6k draws)
    x, y = _batch(mnist_test, 16, 0)
    model = build_model(ModelSpec("mlp", (1, 28, 28), 10, seed=0))
    rec = make_attack("spear").reconstruct(_observe(model, x, y, 10), AttackContext(seed=0))
    errors, _, _ = _matched_errors(rec.inputs, x)
    assert rec.converged and float(errors.max()) <= 1e-6, errors


def test_spear_recovers_conv_features_exactly(mnist_test):
    # lenet5 with ReLU: the 400 conv features entering fc120 at batch 4 (seeds 0-2: exact, MSE ≤ 1e-18;
    # at batch 8 the examples leave only 14-23 of ~90 units inactive and the draws rarely find them all)
    x, y = _batch(mnist_test, 4, 0)
    model = build_model(ModelSpec("lenet5", (1, 28, 28), 10, seed=0, activation="relu"))
    features = make_attack("spear").layer_inputs(_observe(model, x, y, 10), AttackContext(seed=0))
    truth = FeatureExtractor(model, "7")(x).detach()
    errors, _, _ = _matched_errors(features, truth)
    assert float(errors.max()) <= 1e-10 * float(truth.pow(2).mean()), errors


def test_spear_refuses_models_without_a_dense_relu_layer(mnist_test):
    lenet = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    attack = make_attack("spear")
    reason = attack.unsupported(lenet, (1, 28, 28), 10, "image")
    assert reason is not None and "dense layer followed by ReLU" in reason and "\n" not in reason
    x, y = _batch(mnist_test, 2, 0)
    with pytest.raises(GradleakError, match="dense layer followed by ReLU"):
        attack.reconstruct(_observe(lenet, x, y, 10), AttackContext())
    sigmoid = build_model(ModelSpec("mlp", (1, 28, 28), 10, seed=0, activation="sigmoid"))
    assert "dense layer followed by ReLU" in attack.unsupported(sigmoid, (1, 28, 28), 10, "image")


def test_spear_refuses_batches_beyond_its_cap(adult):
    x, y = _batch(adult, 12, 0)
    model = build_model(ModelSpec("mlp", tuple(x.shape[1:]), 2, seed=0))
    with pytest.raises(GradleakError, match="batch 12 is beyond the 10"):
        make_attack("spear:max_batch=10").reconstruct(_observe(model, x, y, 2, "tabular"), AttackContext())


def test_auto_runs_spear_only_where_a_dense_relu_layer_exists():
    threat = make_threat_model("honest")
    for name, runs in (("mlp", True), ("lenet", False)):
        model = build_model(ModelSpec(name, (1, 28, 28), 10, seed=0))
        selected, skipped = select_attacks("auto", model, (1, 28, 28), 10, "image", threat)
        assert any(s.startswith("spear") for s in selected) == runs
        if not runs:
            assert any(s.attack.startswith("spear") and "ReLU" in s.reason for s in skipped)


class _FunctionalMLP(torch.nn.Module):
    """An MLP as apps write it: the ReLU applied in forward (F.relu), no nn.ReLU module."""

    def __init__(self, features, classes, activation):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(features, 256), torch.nn.Linear(256, classes)
        self.activation = activation

    def forward(self, x):
        return self.fc2(self.activation(self.fc1(x.flatten(1))))


def test_spear_finds_a_relu_applied_in_forward(adult):
    x, y = _batch(adult, 8, 0)
    torch.manual_seed(0)
    model = _FunctionalMLP(x.shape[1], 2, torch.nn.functional.relu)
    assert make_attack("spear").unsupported(model, tuple(x.shape[1:]), 2, "tabular") is None
    rec = make_attack("spear").reconstruct(_observe(model, x, y, 2, "tabular"), AttackContext(seed=0))
    errors, _, _ = _matched_errors(rec.inputs, x)
    assert rec.converged and float(errors.max()) <= 1e-6, errors
    # a sigmoid there is no ReLU: refused, as for a model without a dense layer
    sigmoid = _FunctionalMLP(x.shape[1], 2, torch.sigmoid)
    assert "followed by ReLU" in make_attack("spear").unsupported(sigmoid, tuple(x.shape[1:]), 2, "tabular")


@pytest.mark.parametrize("dataset, hidden, size", [("adult", 256, 16), ("breast-cancer", 64, 8)])
def test_spear_recovers_one_hidden_layer_binary_classifiers_exactly(dataset, hidden, size):
    # With two classes every example's ∂L/∂Z is parallel to one vector on its active units, so the
    # difference of two examples' columns cancels wherever both are active: as sparse as either.
    # The head's span rejects those (relative residual 0.99-1.0 against 4e-8 for an example's own).
    # `gradleak attack` seeds 0-9, first rung: adult 9 of 10 batches exact in 0.25-0.83 s (seed 8
    # at the second doubling), breast-cancer 10 of 10 in 0.05-0.22 s; MSE ≤ 1e-13 on every one.
    data = load_dataset(DatasetSpec(dataset, split="test"))
    for seed in (1, 2):
        x, y = _batch(data, size, seed)
        model = build_model(ModelSpec("mlp", tuple(x.shape[1:]), 2, seed=seed, options={"hidden": (hidden,)}))
        rec = make_attack("spear").reconstruct(_observe(model, x, y, 2, "tabular"), AttackContext(seed=seed))
        errors, rows, cols = _matched_errors(rec.inputs, x)
        assert rec.converged and float(errors.max()) <= 1e-6, (seed, errors)
        # (almost) only the examples' own directions pooled: adult 16 of 16, breast-cancer 8-10 for 8
        # over seeds 0-9 (its 64 units leave fewer zeros to tell a cancellation by); 34k without the span
        assert rec.extras["candidates"] <= size + 2
        assert rec.labels[rows].tolist() == y[cols].tolist()


def test_the_head_is_found_only_when_it_alone_takes_the_relu_output():
    from gradleak.attacks.analytic.spear import head_after

    torch.manual_seed(0)
    functional = _FunctionalMLP(12, 2, torch.nn.functional.relu)
    assert head_after(functional, (12,), "fc1") is functional.fc2
    sequential = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                     torch.nn.Linear(32, 2))
    assert head_after(sequential, (12,), "0") is sequential[3]

    class TwoReaders(torch.nn.Module):  # the ReLU output read by two layers: no single head's span
        def __init__(self):
            super().__init__()
            self.fc1, self.a, self.b = torch.nn.Linear(12, 32), torch.nn.Linear(32, 2), torch.nn.Linear(32, 2)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            return self.a(h) + self.b(h)

    assert head_after(TwoReaders(), (12,), "fc1") is None


def test_the_head_span_check_gives_the_same_answer_in_chunks(monkeypatch):
    # a wide layer with a wide head holds rows × units × classes numbers: checked in chunks
    from gradleak.attacks.analytic import spear_core

    data = load_dataset(DatasetSpec("breast-cancer", split="test"))
    x, y = _batch(data, 8, 3)
    model = build_model(ModelSpec("mlp", tuple(x.shape[1:]), 2, seed=3, options={"hidden": (64,)}))
    whole = make_attack("spear").reconstruct(_observe(model, x, y, 2, "tabular"), AttackContext(seed=3))
    monkeypatch.setattr(spear_core, "HEAD_CHUNK", 1)  # one row at a time
    chunked = make_attack("spear").reconstruct(_observe(model, x, y, 2, "tabular"), AttackContext(seed=3))
    assert whole.converged and chunked.converged and whole.iterations == chunked.iterations
    assert torch.equal(whole.inputs, chunked.inputs)


def test_solved_inputs_are_settled_on_a_grid_that_last_bit_differences_do_not_cross():
    # two runs of one seed gave solved inputs a few ulps apart (MKL), and near-zero pixels then
    # differed once rounded to float32: settled rounds both onto the same grid
    generator = torch.Generator().manual_seed(0)
    values = torch.rand(4, 256, generator=generator, dtype=torch.float64) * 0.9
    values[:, :64] = torch.rand(4, 64, generator=generator, dtype=torch.float64) * 1e-9  # solved zeros
    # a solve's rounding is absolute, at the scale of the largest entries
    nudged = values + 2e-16 * torch.randn(values.shape, generator=generator, dtype=torch.float64)
    assert not torch.equal(values.float(), nudged.float())
    assert torch.equal(settled(values), settled(nudged))
    assert (settled(values)[:, :64] == 0).all()
    assert (settled(values) - values).abs().max() <= 2.0 ** -25
