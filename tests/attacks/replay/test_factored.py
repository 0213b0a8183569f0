"""Linear layers' gradients as factors (`attacks.replay.factored`): the same update, the
same cosine distance and the same gradient of it as PyTorch's own double
backward — and the general path wherever the identity does not hold."""
import dataclasses

import pytest
import torch
from torch import nn

from gradleak.attacks.replay import factored
from gradleak.attacks.replay.matching import UpdateSimulator, update_distance
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models import ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, run_attack
from gradleak.threat import make_threat_model, observe

CASES = {  # name -> (model, input shape, activation)
    "mlp": ("mlp", (1, 12, 12), None),
    "mlp-sigmoid": ("mlp", (1, 12, 12), "sigmoid"),
    "twolayer": ("twolayer", (1, 8, 8), None),
    "tabular": ("mlp", (30,), "tanh"),
}


def _observation(case: str, training=TrainingSpec(lr=0.1), batch: int = 4, threat: str = "honest",
                 topk: float | None = None):
    name, shape, activation = CASES[case]
    model = build_model(ModelSpec(name, shape, 10, activation=activation, seed=0,
                                  options={"width": 64} if name == "twolayer" else {}))
    gen = torch.Generator().manual_seed(1)
    x = torch.rand((batch, *shape), generator=gen)
    y = torch.randint(10, (batch,), generator=gen)
    update = compute_update(model, x, y, training)
    defenses = []
    if topk is not None:  # what top-k sends: the largest `topk` of each tensor's entries
        kept = {}
        for n, t in update.tensors.items():
            keep = max(1, int(topk * t.numel()))
            floor = t.abs().flatten().kthvalue(t.numel() - keep + 1).values
            kept[n] = torch.where(t.abs() >= floor, t, torch.zeros_like(t))
        update = dataclasses.replace(update, tensors=kept)
        defenses = [f"topk:sparsity={1 - topk}"]
    obs = observe(update, model, make_threat_model(threat), input_shape=shape, num_classes=10,
                  training=training, batch_size=batch, labels=y, defenses=defenses, modality="image")
    return obs, torch.rand(x.shape, generator=gen), y


def _value_and_grads(sim, candidate, labels, kind, weights=None):
    x = candidate.clone().requires_grad_(True)
    labels = labels.clone().requires_grad_(labels.dtype.is_floating_point)
    update = sim(x, labels)
    distance = update_distance(update, sim.target, kind, weights)
    inputs = [x, labels] if labels.requires_grad else [x]
    materialised = {n: update[n].detach() for n in update}
    return materialised, distance.detach(), torch.autograd.grad(distance, inputs)


@pytest.mark.parametrize("case", list(CASES))
def test_factored_equals_autograd(case):
    obs, candidate, y = _observation(case)
    fast, stock = UpdateSimulator(obs), UpdateSimulator(obs, cheap_double_backward=False)
    assert fast.factored is not None and stock.factored is None
    soft = torch.softmax(torch.randn(len(y), 10, generator=torch.Generator().manual_seed(2)), -1)
    weights = {n: float(i + 1) for i, n in enumerate(fast.names)}
    for labels in (y, soft):  # hard labels (IG, CPL) and DLG's optimised soft labels
        for kind, w in (("cosine", None), ("weighted-cosine", weights), ("l2", None)):
            update_f, value_f, grads_f = _value_and_grads(fast, candidate, labels, kind, w)
            update_s, value_s, grads_s = _value_and_grads(stock, candidate, labels, kind, w)
            assert set(update_f) == set(update_s)
            for n in update_s:
                torch.testing.assert_close(update_f[n], update_s[n], rtol=1e-5, atol=1e-7)
            # 1 - cos is computed from terms near 1: float32 rounding of those terms (~6e-8 each)
            # sets the absolute error floor, whatever the thread count's reduction order.
            torch.testing.assert_close(value_f, value_s, rtol=1e-5, atol=5e-7)
            for g_f, g_s in zip(grads_f, grads_s):
                torch.testing.assert_close(g_f, g_s, rtol=1e-3, atol=1e-4 * float(g_s.abs().max()))


def test_part_of_a_layer_observed():
    # a target naming one layer's weight without its bias and another's bias alone
    obs, candidate, y = _observation("mlp")
    fast, stock = UpdateSimulator(obs), UpdateSimulator(obs, cheap_double_backward=False)
    subset = {n: fast.target[n] for n in ("1.weight", "5.bias")}
    for kind, w in (("cosine", None), ("weighted-cosine", {"1.weight": 0.5, "5.bias": 3.0})):
        values, grads = [], []
        for sim in (fast, stock):
            x = candidate.clone().requires_grad_(True)
            distance = update_distance(sim(x, y), subset, kind, w)
            values.append(distance.detach())
            grads.append(torch.autograd.grad(distance, x)[0])
        torch.testing.assert_close(values[0], values[1], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-3, atol=1e-4 * float(grads[1].abs().max()))


def test_factored_only_where_the_identity_holds():
    obs, _, _ = _observation("mlp", training=TrainingSpec(lr=0.1, local_steps=2))
    assert UpdateSimulator(obs).factored is None  # a FedAvg delta is not Δᵀ A
    lenet = build_model(ModelSpec("lenet", (1, 16, 16), 10, seed=0))
    assert not factored.supports(lenet, [n for n, _ in lenet.named_parameters()], (1, 16, 16))

    def linear_names(model):
        return [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Linear)]

    class Reused(nn.Module):  # one layer applied twice: its gradient is a sum of two products
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(6, 6)

        def forward(self, x):
            return self.layer(torch.relu(self.layer(x)))

    sequence = nn.Sequential(nn.Linear(6, 6), nn.Flatten(), nn.Linear(4 * 6, 3))  # 3-D input rows
    normalised = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    assert not factored.supports(Reused(), ["layer.weight"], (6,))
    assert not factored.supports(sequence, ["0.weight"], (4, 6))
    assert factored.supports(sequence, ["2.weight", "2.bias"], (4, 6))  # the head reads 2-D rows
    assert not factored.supports(normalised, linear_names(normalised), (6,))
    plain = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3))
    assert factored.supports(plain, linear_names(plain), (6,))
    tied = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6))
    tied[2].weight = tied[0].weight  # one weight, two products in its gradient
    assert not factored.supports(tied, ["0.weight", "0.bias", "2.bias"], (6,))


def test_withheld_entries_are_masked_like_the_general_path():
    # top-k with the defense revealed: the simulator masks the candidate's entries
    obs, candidate, y = _observation("mlp", threat="informed", topk=0.1)
    fast, stock = UpdateSimulator(obs), UpdateSimulator(obs, cheap_double_backward=False)
    assert fast.sent is not None
    _, value_f, grads_f = _value_and_grads(fast, candidate, y, "cosine")
    _, value_s, grads_s = _value_and_grads(stock, candidate, y, "cosine")
    torch.testing.assert_close(value_f, value_s, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grads_f[0], grads_s[0], rtol=1e-3, atol=1e-4 * float(grads_s[0].abs().max()))


def test_ig_on_an_mlp_still_reconstructs():
    # the factored path end to end: IG against an MLP's FedSGD gradient on two digits
    result = run_attack(AttackRunSpec(dataset="mnist", model="mlp", attack="ig:iterations=300",
                                      images=2, lpips="none", seed=0))
    assert result.metrics["psnr"] >= 25, result.per_example  # PSNR of the mean MSE, seeds 0-2: 47.0-100 dB
