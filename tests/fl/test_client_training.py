"""The client's training, replayed exactly: gradleak's functional SGD (momentum, dampening,
Nesterov, weight decay), Adam and AdamW against torch.optim step for step, a shuffling
DataLoader's mini-batches, and an attack that replays the declared optimizer against one
that assumes plain SGD."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gradleak.fl import TrainingSpec, compute_update
from gradleak.models import ModelSpec, build_model

OPTIMIZERS = [
    ("sgd:momentum=0.9,weight_decay=5e-4", lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, weight_decay=5e-4)),
    ("sgd:momentum=0.9,dampening=0.1", lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, dampening=0.1)),
    ("sgd:momentum=0.9,nesterov=true,weight_decay=1e-3",
     lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("adam", lambda p, lr: torch.optim.Adam(p, lr=lr)),
    ("adam:weight_decay=1e-3,beta1=0.8",
     lambda p, lr: torch.optim.Adam(p, lr=lr, weight_decay=1e-3, betas=(0.8, 0.999))),
    ("adamw", lambda p, lr: torch.optim.AdamW(p, lr=lr)),
    ("adamw:weight_decay=0.05,eps=1e-6", lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.05, eps=1e-6)),
]


@pytest.mark.parametrize("model_name", ["lenet", "mlp"])
@pytest.mark.parametrize("text,reference", OPTIMIZERS, ids=[t for t, _ in OPTIMIZERS])
def test_the_replayed_optimizer_is_torch_optim_step_for_step(mnist_test, model_name, text, reference):
    x, y = mnist_test.inputs[:8], mnist_test.labels[:8]
    model = build_model(ModelSpec(model_name, (1, 28, 28), 10, seed=0))
    lr = 0.01 if text.startswith("adam") else 0.1
    training = TrainingSpec(lr=lr, local_epochs=3, local_batch_size=4, optimizer=text)
    update = compute_update(model, x, y, training)
    assert update.kind == "delta"
    twin = copy.deepcopy(model)
    optimizer = reference(list(twin.parameters()), lr)
    for _ in range(3):  # the client's 3 epochs of 2 mini-batches, in order
        for start in (0, 4):
            optimizer.zero_grad()
            F.cross_entropy(twin(x[start:start + 4]), y[start:start + 4]).backward()
            optimizer.step()
    with torch.no_grad():
        worst = max(float((update.tensors[n] - (p - q)).abs().max())
                    for (n, p), q in zip(model.named_parameters(), twin.parameters()))
    # measured 9e-8 to 9e-7 (float rounding); on models with a bias before batch norm, Adam
    # turns that bias's float-noise gradient into full steps, so those are not compared here
    assert worst < 1e-5


def test_any_other_optimizer_than_plain_sgd_sends_a_delta_even_after_one_step():
    assert TrainingSpec().is_fedsgd
    assert not TrainingSpec(optimizer="sgd:weight_decay=1e-4").is_fedsgd
    assert not TrainingSpec(optimizer="adam").is_fedsgd
    assert TrainingSpec(optimizer="adamw").optimizer_options.weight_decay == 0.01  # torch's AdamW default


@pytest.mark.parametrize("text,said", [
    ("rmsprop", "unknown optimizer 'rmsprop'; gradleak replays: sgd, adam, adamw"),
    ("sgd:momentum=2", "option 'momentum' = 2 is out of range"),
    ("sgd:nesterov=true", "nesterov needs momentum > 0 and dampening 0"),
    ("adam:beta3=0.5", "has no option 'beta3'"),
])
def test_an_optimizer_gradleak_does_not_model_is_one_line(capsys, text, said):
    from gradleak.cli import main

    code = main(["attack", "--dataset", "mnist", "--model", "lenet", "--attack", "dlg:iterations=1",
                 "--local-steps", "2", "--optimizer", text, "--lpips", "none"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and said in err



@pytest.mark.parametrize("argv,said", [
    (["attack", "--dataset", "mnist", "--model", "lenet", "--attack", "dlg:iterations=1", "--lpips", "none",
      "--local-steps", "3", "--local-epochs", "2"], "not allowed with argument"),
    (["utility", "--dataset", "digits", "--model", "mlp:hidden=8", "--rounds", "1", "--clients", "2",
      "--per-round", "1", "--local-epochs", "2", "--local-steps", "3"], "not allowed with argument"),
])
def test_steps_and_epochs_together_are_one_line_not_one_ignored(capsys, argv, said):
    from gradleak.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err


def test_a_training_declared_with_steps_and_epochs_is_refused():
    from gradleak.errors import GradleakError
    from gradleak.utility import UtilitySpec

    with pytest.raises(GradleakError, match="give one"):
        TrainingSpec(lr=0.1, local_steps=3, local_epochs=2)
    with pytest.raises(GradleakError, match="give one"):
        UtilitySpec(local_steps=3, local_epochs=2)
    assert TrainingSpec(lr=0.1, local_epochs=2).num_steps(4) == 2  # epochs alone, one step a pass of 4

@pytest.mark.slow
def test_an_attack_that_replays_the_clients_momentum_recovers_what_plain_sgd_replay_cannot():
    from gradleak.attacks import AttackContext, make_attack
    from gradleak.metrics import summarize
    from gradleak.run.experiment import AttackRunSpec, build_scenario_model, scenario_data
    from gradleak.run.ladder import climb_budget_ladder
    from gradleak.threat import make_threat_model, observe

    spec = AttackRunSpec(dataset="mnist", model="lenet", attack="cpl:iterations=50", lpips="none")
    data = scenario_data(spec)
    client = TrainingSpec(lr=0.1, local_epochs=4, local_batch_size=1, optimizer="sgd:momentum=0.9")

    def attack(seed: int, declared: TrainingSpec) -> float:
        model = build_scenario_model(dataclasses.replace(spec, seed=seed), data.signature)
        x, y = data.inputs[seed:seed + 1], data.labels[seed:seed + 1]
        update = compute_update(model, x, y, client)
        obs = observe(update, model, make_threat_model("honest"), input_shape=data.input_shape, num_classes=10,
                      training=declared, batch_size=1, labels=y, defenses=[], modality=data.modality)
        scores = climb_budget_ladder(make_attack(spec.attack), obs, x, y, AttackContext(seed=seed), "none", None,
                                     0).scores
        return summarize(scores)["psnr"]

    # 4 momentum steps on one example, seeds 0-3 on one thread: replaying the momentum
    # 43.3 / 43.8 / 46.9 / 52.3 dB (exact copies); assuming plain SGD 3.2 / 4.3 / 3.3 / 3.8 dB
    for seed in (0, 1):
        assert attack(seed, client) > 35
    assert attack(0, dataclasses.replace(client, optimizer="sgd")) < 10


def test_a_shuffling_dataloader_client_is_replayed_batch_for_batch(mnist_test):
    from torch.utils.data import DataLoader, TensorDataset

    # 10 examples in mini-batches of 4: a fresh order every epoch and a last batch of 2
    x, y = mnist_test.inputs[:10], mnist_test.labels[:10]
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    training = TrainingSpec(lr=0.1, local_epochs=3, local_batch_size=4, shuffle_seed=11,
                            optimizer="sgd:momentum=0.9,weight_decay=5e-4")
    update = compute_update(model, x, y, training)
    assert update.steps == 9
    twin = copy.deepcopy(model)
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(11))
    for _ in range(3):
        for xb, yb in loader:
            optimizer.zero_grad()
            F.cross_entropy(twin(xb), yb).backward()
            optimizer.step()
    with torch.no_grad():
        worst = max(float((update.tensors[n] - (p - q)).abs().max())
                    for (n, p), q in zip(model.named_parameters(), twin.parameters()))
    assert worst < 1e-5  # measured 1.4e-6


def test_the_server_replays_the_known_order_and_only_the_known_order(mnist_test):
    from gradleak.attacks.replay.head_unroll import make_simulator
    from gradleak.threat import make_threat_model, observe

    x, y = mnist_test.inputs[:4], mnist_test.labels[:4]
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    client = TrainingSpec(lr=0.1, local_epochs=2, local_batch_size=2, shuffle_seed=3)
    update = compute_update(model, x, y, client)

    def mismatch(declared: TrainingSpec) -> float:
        obs = observe(update, model, make_threat_model("honest"), input_shape=(1, 28, 28), num_classes=10,
                      training=declared, batch_size=4, labels=y, defenses=[], modality="image")
        simulated = make_simulator(obs)(x, y)  # the low-rank head replay on this Sequential LeNet
        return max(float((simulated[n].detach() - update.tensors[n]).abs().max()) for n in update.tensors)

    assert mismatch(client) < 1e-6  # the true batch, replayed in the client's order, is what it sent
    assert mismatch(dataclasses.replace(client, shuffle_seed=None)) > 1e-3  # in order, it is not


def test_label_smoothing_and_gradient_clipping_are_replayed_as_pytorch_trains(mnist_test):
    x, y = mnist_test.inputs[:8], mnist_test.labels[:8]
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    training = TrainingSpec(lr=0.1, local_epochs=2, local_batch_size=4, optimizer="sgd:momentum=0.9",
                            label_smoothing=0.1, clip_norm=0.5, shuffle_seed=5)
    update = compute_update(model, x, y, training)
    twin = copy.deepcopy(model)
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(5))
    norms = []
    for _ in range(2):
        for xb, yb in loader:
            optimizer.zero_grad()
            F.cross_entropy(twin(xb), yb, label_smoothing=0.1).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)))
            optimizer.step()
    assert max(norms) > 0.5  # the bound clipped some steps
    with torch.no_grad():
        worst = max(float((update.tensors[n] - (p - q)).abs().max())
                    for (n, p), q in zip(model.named_parameters(), twin.parameters()))
    assert worst < 1e-5  # float rounding (measured below 1e-6)
    plain = compute_update(model, x, y, dataclasses.replace(training, label_smoothing=0.0, clip_norm=None))
    assert max(float((plain.tensors[n] - update.tensors[n]).abs().max()) for n in plain.tensors) > 1e-3


def test_a_shuffle_the_server_cannot_replay_stays_with_the_client(mnist_test, capsys):
    from gradleak.cli import main

    client = TrainingSpec(lr=0.1, local_epochs=2, local_batch_size=2, shuffle="unknown", shuffle_seed=7)
    seen = client.server_view()
    assert seen.order == "unknown" and seen.shuffle_seed is None and not seen.replayable
    assert client.step_indices(4) != TrainingSpec(lr=0.1, local_epochs=2, local_batch_size=2).step_indices(4)
    code = main(["attack", "--dataset", "mnist", "--model", "lenet", "--attack", "ig:iterations=2",
                 "--batch-size", "4", "--local-epochs", "2", "--local-batch-size", "2", "--shuffle", "unknown"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "order is unknown" in err[0] and "fedavg" in err[0]
    with pytest.raises(Exception, match="needs the client's --shuffle-seed"):
        TrainingSpec(shuffle="known")


def test_augmentation_draws_come_from_the_client_and_change_the_update(mnist_test):
    from gradleak.modalities import modality

    augmented = modality("image").augmented
    x = mnist_test.inputs[:6]
    same = augmented(x, ("crop",), 0, torch.Generator().manual_seed(0))
    assert torch.equal(same, x)  # no padding: the crop is the image
    flipped = augmented(x, ("flip",), 4, torch.Generator().manual_seed(0))
    rows = [bool(torch.equal(a, b.flip(-1))) or bool(torch.equal(a, b)) for a, b in zip(flipped, x)]
    assert all(rows) and not torch.equal(flipped, x)
    cropped = augmented(x, ("crop",), 2, torch.Generator().manual_seed(1))
    assert cropped.shape == x.shape and not torch.equal(cropped, x)
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    training = TrainingSpec(lr=0.1, local_epochs=2, local_batch_size=3, augment=("crop", "flip"), crop_padding=2)
    a = compute_update(model, x, mnist_test.labels[:6], training, generator=torch.Generator().manual_seed(0))
    b = compute_update(model, x, mnist_test.labels[:6], training, generator=torch.Generator().manual_seed(1))
    assert max(float((a.tensors[n] - b.tensors[n]).abs().max()) for n in a.tensors) > 1e-4


def test_an_optimizer_registered_from_outside_is_replayed(mnist_test):
    """The optimizers are a Registry: RMSprop, added from outside gradleak with its own step,
    trains the client as torch.optim.RMSprop does, and leaves the registry as it was."""
    from gradleak.fl.optimizers import Optimizer
    from gradleak.fl.training import OPTIMIZERS

    @dataclasses.dataclass(frozen=True)
    class RMSpropOptions:
        alpha: float = 0.99
        eps: float = 1e-8

    class RMSprop(Optimizer):
        name = "rmsprop"
        Options = RMSpropOptions

        @staticmethod
        def step(options, lr, step, p, grad, memory):
            square = options.alpha * memory["v"] if step else torch.zeros_like(grad)
            memory["v"] = square + (1 - options.alpha) * grad * grad
            return p - lr * grad / (memory["v"].sqrt() + options.eps)

    x, y = mnist_test.inputs[:8], mnist_test.labels[:8]
    model = build_model(ModelSpec("mlp", (1, 28, 28), 10, seed=0))
    OPTIMIZERS.register("rmsprop", RMSprop)
    try:
        update = compute_update(model, x, y, TrainingSpec(lr=0.001, local_steps=2, optimizer="rmsprop:alpha=0.9"))
    finally:
        OPTIMIZERS.unregister("rmsprop")
    twin = copy.deepcopy(model)
    optimizer = torch.optim.RMSprop(twin.parameters(), lr=0.001, alpha=0.9)
    for _ in range(2):
        optimizer.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        worst = max(float((update.tensors[n] - (p - q)).abs().max())
                    for (n, p), q in zip(model.named_parameters(), twin.parameters()))
    assert worst < 1e-5
    assert "rmsprop" not in OPTIMIZERS
