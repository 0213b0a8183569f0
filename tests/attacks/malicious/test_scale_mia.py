"""scale-mia: bins written into the model's own first dense+ReLU layer, plain and disguised (MNIST
test split; an MLP whose bins see the input, the ReLU LeNet-5 whose bins see its features)."""
import pytest
import torch

from gradleak.attacks import AttackContext, make_attack
from gradleak.errors import GradleakError
from gradleak.guard import check_received
from gradleak.models import ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, run_attack

INFORMED = dict(dataset="mnist", threat="malicious", knows=("prior_data",), lpips="none")


def _copied(result) -> float:
    return sum(1 for s in result.per_example if (s["psnr"] or 0) >= 30) / len(result.per_example)


def test_on_the_input_the_bins_copy_most_examples_disguised_or_not():
    # mlp, batch 32, seeds 2-7: disguised 69-100 % copied, plain 66-100 %; seed 4: 94 % and 100 %
    for attack in ("scale-mia", "scale-mia:disguise=0"):
        copied = _copied(run_attack(AttackRunSpec(attack=attack, model="mlp", batch_size=32, seed=4, **INFORMED)))
        assert copied >= 0.8, (attack, copied)


def test_too_few_units_for_the_batch_collide():
    # four times as many examples as the mlp has bins (256): few alone in theirs
    model = build_model(ModelSpec("mlp", (1, 28, 28), 10, seed=0))
    units = next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).out_features
    batch = 4 * units
    copied = _copied(run_attack(AttackRunSpec(attack="scale-mia", model="mlp", batch_size=batch, seed=4, **INFORMED)))
    assert copied < 0.3, copied


def test_through_secure_aggregation_of_four_clients_of_16_most_of_the_client_is_copied():
    # mlp, 64 examples summed in its 256 bins: seeds 2-9 copy 7-15 of the attacked client's 16
    # (91 of 128); seed 4: 14
    result = run_attack(AttackRunSpec(attack="scale-mia", model="mlp", batch_size=16, defenses=("secagg:clients=4",),
                                      seed=4, **INFORMED))
    assert _copied(result) >= 0.6, _copied(result)


def test_behind_convolutions_the_features_are_inverted_to_recognisable_digits():
    # the ReLU LeNet-5's 120 bins, 4 clients of 16 summed: seeds 2-9 give 0-13 of the attacked
    # client's 16 recognisable, 63 of 128 (docs/analytic-attacks.md); seed 5: 10
    result = run_attack(AttackRunSpec(attack="scale-mia", model="lenet5", activation="relu", batch_size=16,
                                      defenses=("secagg:clients=4",), seed=5, **INFORMED))
    assert result.metrics["recognizable"] >= 0.4, result.metrics["recognizable"]


def _crafted(attack: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    honest = build_model(ModelSpec("lenet5", (1, 28, 28), 10, activation="relu", seed=0))
    crafted = make_attack(attack).prepare_model(build_model(ModelSpec("lenet5", (1, 28, 28), 10, activation="relu",
                                                                      seed=0)), (1, 28, 28), 10, AttackContext())
    return honest, crafted.model


def test_the_disguise_passes_the_guards_checks_of_one_model_but_not_the_change_since_the_last():
    honest, plain = _crafted("scale-mia:disguise=0")
    assert {"duplicate_rows", "rank_one"} <= set(check_received(plain).checks)
    honest, disguised = _crafted("scale-mia")
    assert not check_received(disguised).crafted, check_received(disguised).summary()
    assert not check_received(honest).crafted
    # with last round's model and the client's own step to it, the rewritten layers stand out
    own_change = {n: 1e-3 * torch.randn_like(p) for n, p in honest.named_parameters()}
    assert "change_beyond_fedavg" in check_received(disguised, honest, own_change).checks


def test_the_disguised_rows_are_far_from_parallel_and_the_read_out_far_from_rank_one():
    _, disguised = _crafted("scale-mia")
    rows = torch.nn.functional.normalize(disguised.get_submodule("7").weight.double(), dim=1)
    cosines = rows @ rows.T
    assert cosines.fill_diagonal_(0).max() < 0.99
    singular = torch.linalg.svdvals(disguised.get_submodule("9").weight.double())
    assert singular[1] / singular[0] > 1e-2


def test_refusals_are_one_line():
    sigmoid = build_model(ModelSpec("lenet5", (1, 28, 28), 10, seed=0))
    reason = make_attack("scale-mia").unsupported(sigmoid, (1, 28, 28), 10, "image")
    assert reason and "ReLU" in reason and "\n" not in reason
    with pytest.raises(GradleakError, match="disguise"):
        make_attack("scale-mia:disguise=-1")
    with pytest.raises(GradleakError, match="--knows prior_data"):
        make_attack("scale-mia:calibration=prior").prepare_model(
            build_model(ModelSpec("mlp", (1, 28, 28), 10, seed=0)), (1, 28, 28), 10, AttackContext())
