"""Every registered defense, through the defense contract that gradleak.testing ships to plugins
(gradleak/testing/defenses.py says what it holds). A newly registered defense is checked by
being registered."""
from __future__ import annotations

import pytest

from gradleak.defenses import DEFENSES
from gradleak.testing import defenses as contract

NAMES = DEFENSES.names()


@pytest.mark.parametrize("name", NAMES)
def test_declarations_and_option_checks(name):
    contract.check_defense_declarations(name)


@pytest.mark.parametrize("name", NAMES)
def test_privacy_is_none_or_a_positive_epsilon(name):
    contract.check_defense_privacy(name)


@pytest.mark.parametrize("training", list(contract.TRAININGS))
@pytest.mark.parametrize("model_text, modality", contract.CLIENTS, ids=[m for _, m in contract.CLIENTS])
@pytest.mark.parametrize("name", NAMES)
def test_update_keeps_its_structure_is_finite_and_repeats_for_the_same_stream(name, model_text, modality, training):
    contract.check_defense_update(name, model_text, modality, training)


@pytest.mark.parametrize("name", NAMES)
def test_an_update_depends_on_the_client_stream_not_on_earlier_updates(name):
    contract.check_defense_depends_only_on_the_stream(name)
