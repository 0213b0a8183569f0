"""The outbound bins check: pairs of a dense layer's rows whose update difference is one of the
client's examples (MNIST test split; the ReLU LeNet-5 and the MLP, honest and crafted by scale-mia)."""
import pytest
import torch

from gradleak.attacks import AttackContext, make_attack
from gradleak.data import DatasetSpec, load_dataset
from gradleak.fl import TrainingSpec, compute_update
from gradleak.guard import Guard, GuardConfig, check_received
from gradleak.guard.bins import binned_pairs
from gradleak.models import ModelSpec, build_model

FEDSGD = TrainingSpec(lr=0.1)
# the utility case's client of docs/guard.md: 10 local epochs of SGD with momentum
LOCAL = TrainingSpec(lr=0.05, optimizer="sgd:momentum=0.9,weight_decay=0.0005", local_epochs=10, local_batch_size=8)


@pytest.fixture(scope="module")
def digits():
    data = load_dataset(DatasetSpec("mnist", split="test"))
    return data.inputs[:64].float(), data.labels[:64]


def _model(name: str, attack: str | None = None) -> torch.nn.Module:
    model = build_model(ModelSpec(name, (1, 28, 28), 10, activation="relu", seed=0))
    if attack is None:
        return model
    return make_attack(attack).prepare_model(model, (1, 28, 28), 10, AttackContext(seed=1)).model


@pytest.mark.parametrize("name", ["lenet5", "mlp"])
@pytest.mark.parametrize("batch", [8, 64])
@pytest.mark.parametrize("training", [FEDSGD, LOCAL], ids=["fedsgd", "10-epochs"])
def test_an_honest_model_has_no_binned_pairs(digits, name, batch, training):
    x, y = digits[0][:batch], digits[1][:batch]
    model = _model(name)
    assert binned_pairs(model, compute_update(model, x, y, training), x) == []


@pytest.mark.parametrize("name,batch,least", [("lenet5", 8, 6), ("lenet5", 64, 20), ("mlp", 64, 35)])
def test_the_disguised_scale_mia_bins_are_found_where_the_inbound_checks_see_nothing(digits, name, batch, least):
    # seed 1's crafted models, FedSGD: 7 of 8 and 27 of 64 examples read from pairs (LeNet-5), 41 of
    # 64 (MLP); the attack itself recognises 5 of 8 and 22 of 64 on such clients (docs/guard.md)
    x, y = digits[0][:batch], digits[1][:batch]
    crafted = _model(name, "scale-mia")
    assert not check_received(crafted).crafted
    pairs = binned_pairs(crafted, compute_update(crafted, x, y, FEDSGD), x)
    assert len(pairs) >= least, len(pairs)
    assert all(p.cosine > 0.999 for p in pairs)


def test_the_guard_withholds_a_binned_update_without_auditing_it(digits):
    x, y = digits[0][:8], digits[1][:8]
    crafted = _model("lenet5", "scale-mia")
    guard = Guard(GuardConfig(), training=FEDSGD)
    decision = guard.outbound(crafted, compute_update(crafted, x, y, FEDSGD), (x, y), training=FEDSGD)
    assert not decision.send and decision.grade == "crafted" and not decision.audits
    assert "bins this client's examples" in decision.reason
