"""Every registered model, through the model contract that gradleak.testing ships to plugins
(gradleak/testing/models.py says what it holds). A newly registered model is checked by being
registered."""
from __future__ import annotations

import pytest

from gradleak.models import MODELS
from gradleak.testing import check_model

NAMES = MODELS.names()


@pytest.mark.parametrize("name", NAMES)
def test_reads_a_modality_seeded_finite_and_trainable_and_refuses_the_others_inone_line(name):
    check_model(name)
