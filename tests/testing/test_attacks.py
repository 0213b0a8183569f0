"""Every registered attack, through the attack contract that gradleak.testing ships to plugins
(gradleak/testing/attacks.py says what it holds). A newly registered attack is checked by being
registered."""
from __future__ import annotations

import dataclasses

import pytest

from gradleak.attacks import ATTACKS
from gradleak.modalities import MODALITIES
from gradleak.testing import attacks as contract

NAMES = ATTACKS.names()
PAIRS = [(name, modality) for name in NAMES for modality in ATTACKS.get(name).modalities]
# Runs of more than a few seconds on one thread at the tiny budget: the learned inverter trains
# its network (one epoch on 256 auxiliary examples) before it reconstructs.
SLOW = {("learned", "image")}
# class fishing says so when the batch holds no example of its target class, as these two do not
pytestmark = pytest.mark.filterwarnings("ignore:.*nothing reconstructed. no example of target_class:UserWarning")


@pytest.mark.parametrize("name", NAMES)
def test_declarations(name):
    contract.check_attack_declarations(name)


@pytest.mark.parametrize("name", NAMES)
def test_options_budgets_and_presets_are_valid(name):
    contract.check_attack_options(name)


@pytest.mark.parametrize("name", NAMES)
def test_fits_a_built_in_model_of_every_modality_it_declares(name):
    contract.check_attack_fits_a_built_in_model(name)


def _params(name, modality):
    marks = [pytest.mark.slow] if (name, modality) in SLOW else []
    return pytest.param(name, modality, marks=marks, id=f"{name}-{modality}")


@pytest.mark.parametrize("name, modality", [_params(n, m) for n, m in PAIRS])
def test_reconstructs_the_datas_shape_and_type_the_same_for_the_same_seed(name, modality):
    contract.check_attack_reconstructs(name, modality)


@pytest.mark.parametrize("name", NAMES)
def test_an_observation_lacking_what_it_declared_is_refused_inone_line(name):
    contract.check_attack_refuses_what_it_was_not_granted(name)


def test_every_attack_is_checked():
    """The parameter lists above come from the registry: an attack registered at run time (a
    plugin) is in them too."""
    assert set(NAMES) == set(ATTACKS.names()) and len(NAMES) >= 19
    assert {m for _, m in PAIRS} == set(MODALITIES)
    assert all(dataclasses.is_dataclass(ATTACKS.get(n).Options) for n in NAMES if ATTACKS.get(n).Options)
