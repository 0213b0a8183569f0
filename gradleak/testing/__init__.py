"""Contract checks for gradleak components, shipped so that plugins run them in their own tests,
as scikit-learn ships `check_estimator`:

    from gradleak.testing import check_attack

    def test_my_attack_keeps_the_contract():
        check_attack("my-attack")        # registered by an entry point or ATTACKS.register

Each check runs the component on a few real examples of each modality it declares, with small
built-in models and tiny budgets (`gradleak.testing.probes`), and raises `ContractError` (an
AssertionError) naming the part of the contract that fails. gradleak's own tests run the same
checks on every registered attack, defense and model (tests/testing/).
"""
from .attacks import check_attack
from .defenses import check_defense
from .models import check_model
from .probes import ContractError

__all__ = ["check_attack", "check_defense", "check_model", "ContractError"]
