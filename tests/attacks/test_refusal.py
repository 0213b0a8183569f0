"""One attack/threat compatibility check (`attacks.base.refusal`): attack selection, every run
(`check_scenario`) and `gradleak.audit` refuse an attack that does not fit with the same reason."""
from __future__ import annotations

import pytest
import torch

import gradleak
from gradleak.api import select_attacks
from gradleak.attacks import make_attack
from gradleak.attacks.base import AttackRefused, refusal
from gradleak.data.tensors import dataset_from_tensors
from gradleak.models import ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, check_scenario
from gradleak.threat import make_threat_model


@pytest.fixture
def images():
    g = torch.Generator().manual_seed(0)
    return dataset_from_tensors(torch.rand(8, 1, 28, 28, generator=g), torch.arange(8) % 10, num_classes=10)


@pytest.mark.parametrize("attack, model_name, threat, expected", [
    ("dager", "lenet", "honest", "does not handle image data"),          # the modality
    ("feature-prior", "lenet", "honest", "which threat model 'honest' does not grant"),  # the threat model
    ("spear", "lenet", "honest", "ReLU"),                                # the architecture
])
def test_selection_and_the_run_give_one_reason(images, attack, model_name, threat, expected):
    model = build_model(ModelSpec(model_name, (1, 28, 28), 10, seed=0))
    threat_model = make_threat_model(threat)
    reason = refusal(make_attack(attack), threat_model, "image", model, (1, 28, 28), 10)
    assert reason is not None and expected in reason
    _, skipped = select_attacks([attack], model, (1, 28, 28), 10, "image", threat_model, budget="standard")
    assert [s.reason for s in skipped] == [reason]
    spec = AttackRunSpec(dataset="mine", model=model_name, attack=attack, batch_size=1, threat=threat)
    with pytest.raises(AttackRefused) as refused:
        check_scenario(spec, images, model)
    assert refused.value.reason == reason
    assert str(refused.value).startswith(f"attack '{attack}' {reason}")


def test_audit_lists_an_attack_the_architecture_refuses_with_the_selection_reason(images):
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    result = gradleak.audit(model, (images.inputs, images.labels), attacks=["spear"])
    assert not result.runs
    _, skipped = select_attacks(["spear"], model, (1, 28, 28), 10, "image", make_threat_model("honest"))
    assert [(s.attack, s.reason) for s in result.skipped] == [(s.attack, s.reason) for s in skipped]
