"""D-SNR (Garov et al.'s disaggregation SNR): an honest model's examples contribute gradients of
comparable size, a model crafted to isolate examples does not."""
import pytest
import torch
from torch import nn

from gradleak.attacks import make_attack
from gradleak.attacks.base import AttackContext
from gradleak.data import load_dataset
from gradleak.data.references import dataset_spec
from gradleak.guard.dsnr import disaggregation_snr
from gradleak.models import ModelSpec, build_model

MNIST = (1, 28, 28)


@pytest.fixture(scope="module")
def batch():
    data = load_dataset(dataset_spec("mnist", "test", None))
    return data.inputs[:8], data.labels[:8]


def _crafted(spec: str, seed: int) -> nn.Module:
    return make_attack(spec).prepare_model(build_model(ModelSpec("lenet5", MNIST, 10, seed=seed)), MNIST, 10,
                                           AttackContext(seed=seed)).model


def test_honest_models_score_low_fishing_infinite_and_robbing_the_fed_above_honest(batch):
    # seeds 0-4, one thread: honest 1.45-2.19; fishing inf; rtf 2.34-5.74, 1.39-3.05x the honest
    # model of its seed (2.0-3.05x on seeds 0-2)
    x, y = batch
    for seed in range(3):
        honest = disaggregation_snr(build_model(ModelSpec("lenet5", MNIST, 10, seed=seed)), x, y)
        assert 1 < honest < 3
        assert disaggregation_snr(_crafted("fishing", seed), x, y) == float("inf")
        assert disaggregation_snr(_crafted("rtf", seed), x, y) > 1.5 * honest


def test_the_ratio_is_the_largest_gradient_over_the_mean_of_the_rest():
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1])
    # softmax is uniform: ∇_W ℓ(x_i) = (p − onehot(y_i)) x_iᵀ, its norm ‖p − e_y‖·‖x_i‖ = √0.5·‖x_i‖
    assert disaggregation_snr(model, x, y) == pytest.approx(2.0 / ((1.0 + 1.0) / 2))
    with pytest.raises(ValueError, match="two or more"):
        disaggregation_snr(model, x[:1], y[:1])
