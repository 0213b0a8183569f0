"""`attacks="auto"`: which attacks fit an architecture is read from its modules."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import gradleak
from gradleak.api import select_attacks
from gradleak.attacks import ATTACKS, make_attack
from gradleak.errors import GradleakError
from gradleak.models import ModelSpec, build_model
from gradleak.threat import make_threat_model


class ConvBN(nn.Module):
    """A user's conv net with batch norm and a custom forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.out = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.conv(x))).flatten(1))


def _names(texts):
    return {t.split(":")[0] for t in texts}


def _supported(model, shape, threat="malicious", knows=()):
    modality = "image" if len(shape) == 3 else "tabular"
    ran, skipped = select_attacks("auto", model, shape, 10, modality, make_threat_model(threat, knows))
    return _names(ran), {s.attack.split(":")[0]: s.reason for s in skipped}


def test_fully_connected_first_layer_and_two_layer_networks():
    two_layer = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    ran, skipped = _supported(two_layer, (1, 8, 8))
    assert {"fc-analytic", "tensor", "cpa", "rtf"} <= ran
    deeper = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                           nn.Linear(32, 10))
    ran, skipped = _supported(deeper, (1, 8, 8))
    assert "fc-analytic" in ran and "two-layer" in skipped["tensor"]


def test_conv_first_and_batch_norm_models():
    ran, skipped = _supported(ConvBN(), (1, 8, 8), knows=("bn_statistics",))
    assert "fully connected" in skipped["fc-analytic"] and "tensor" in skipped
    assert "gradinversion" in ran  # batch norm present and its statistics granted
    assert "batch-norm" in skipped["mkor"]
    plain = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))
    ran, skipped = _supported(plain, (1, 8, 8), knows=("bn_statistics",))
    assert "batch-norm" in skipped["gradinversion"]


def test_head_without_bias_and_threat_model_reasons():
    no_bias = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10, bias=False))
    ran, skipped = _supported(no_bias, (1, 8, 8))
    assert "bias" in skipped["fishing"]
    ran, skipped = _supported(no_bias, (1, 8, 8), threat="honest")
    for name in ("rtf", "mkor", "fishing", "feature-prior"):
        assert "malicious_model" in skipped[name]
    assert not ran & set(skipped)
    assert ran | set(skipped) == set(ATTACKS.names())


@pytest.mark.parametrize("name, shape, expected_ok, expected_skip", [
    ("lenet", (1, 28, 28), {"ig", "dlg", "cpl", "rog", "cpa", "rtf"}, {"fc-analytic", "tensor", "mkor"}),
    ("lenet5", (1, 32, 32), {"mkor", "ig"}, {"fc-analytic", "tensor", "gradinversion"}),
    ("resnet20", (3, 32, 32), {"gradinversion", "ig"}, {"mkor", "tensor", "fc-analytic"}),
    ("mlp", (64,), {"fc-analytic", "cpa", "dlg"}, {"tensor", "rog", "mkor"}),
    ("twolayer", (64,), {"fc-analytic", "tensor"}, {"mkor", "gradinversion"}),
])
def test_built_in_models(name, shape, expected_ok, expected_skip):
    model = build_model(ModelSpec(name, shape, 10))
    ran, skipped = _supported(model, shape, knows=("bn_statistics",))
    assert expected_ok <= ran, skipped
    assert expected_skip <= set(skipped)


@pytest.mark.parametrize("attack, model", [
    ("fc-analytic", "lenet"), ("tensor", "lenet"), ("mkor", "lenet"),
])
def test_check_and_run_time_agree(attack, model):
    """An attack the check rules out stops with the same reason when forced."""
    from gradleak.run.experiment import AttackRunSpec, run_attack

    built = build_model(ModelSpec(model, (1, 28, 28), 10))
    reason = make_attack(attack).unsupported(built, (1, 28, 28), 10, "image")
    assert reason
    with pytest.raises(GradleakError) as err:
        run_attack(AttackRunSpec(dataset="mnist", model=model, attack=attack, threat="malicious", lpips="none"))
    assert reason.split(";")[0].split("(")[0].strip() in str(err.value)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_on_tabular_data_runs_and_explains(seed):
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 12, generator=gen)
    y = torch.randint(0, 3, (40,), generator=gen)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    result = gradleak.audit(model, (x, y), attacks="auto", batch_size=2, lpips="none", seed=seed,
                            budget="quick", threat="informed")
    ran = _names(r.spec.attack for r in result.runs)
    assert {"fc-analytic", "ig", "dlg", "cpl", "cpa"} <= ran
    reasons = {s.attack.split(":")[0]: s.reason for s in result.skipped}
    assert "tabular" in reasons["rog"] and "malicious_model" in reasons["rtf"]
    # tensor fits the architecture but refuses at run time on this initialisation, with its reason
    assert "identical head rows" in reasons["tensor"]
    assert ran | set(reasons) == set(ATTACKS.names())
    # FedSGD on two tabular rows of a small ReLU MLP is recovered exactly by the strongest
    # attack (measured MSE 3e-16 to 3e-8 over seeds 0-3)
    assert result.strongest("mse").metrics["mse"] < 1e-6
