"""The cheap double backward (`attacks.replay.double_backward`) must be the stock
second derivative, only faster: same simulated update, same gradient of the
update distance w.r.t. the candidate, and the observed model left alone."""
import copy

import pytest
import torch

from gradleak.attacks.replay import double_backward, matching
from gradleak.attacks.replay.double_backward import make_twice_differentiable
from gradleak.attacks.replay.matching import UpdateSimulator, update_distance
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models import ModelSpec, build_model
from gradleak.threat import make_threat_model, observe

# small images keep the float64 second derivatives fast; the layers are the same
SHAPES = {"lenet": (1, 16, 16), "convnet": (3, 12, 12), "resnet20": (3, 12, 12)}
TRAININGS = {"fedsgd": TrainingSpec(lr=0.1),
             "fedavg_tau2": TrainingSpec(lr=0.1, local_steps=2, local_batch_size=2)}


@pytest.fixture(autouse=True)
def every_conv_custom(monkeypatch):
    # these small test layers would otherwise keep PyTorch's conv (MIN_CONV_MACS)
    monkeypatch.setattr(double_backward, "MIN_CONV_MACS", 0)


def _observation(name: str, training: TrainingSpec, batch: int = 4):
    shape = SHAPES[name]
    model = build_model(ModelSpec(name, shape, 10, seed=0)).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.rand((batch, *shape), generator=gen, dtype=torch.double)
    y = torch.randint(10, (batch,), generator=gen)
    obs = observe(compute_update(model, x, y, training), model, make_threat_model("honest"),
                  input_shape=shape, num_classes=10, training=training, batch_size=batch, labels=y,
                  defenses=[], modality="image")
    candidate = torch.rand(x.shape, generator=gen, dtype=torch.double)
    return obs, candidate, y


def _update_and_grad(sim: UpdateSimulator, candidate: torch.Tensor, y: torch.Tensor, how: str):
    x = candidate.clone().requires_grad_(True)
    update = sim(x, y)
    distance = update_distance(update, sim.target, "cosine") + update_distance(update, sim.target, "l2")
    if how == "grad":
        (grad,) = torch.autograd.grad(distance, [x])
    elif how == "backward-inputs":
        distance.backward(inputs=[x])
        grad = x.grad
    else:
        distance.backward()
        grad = x.grad
    return {n: t.detach() for n, t in update.items()}, grad


@pytest.mark.parametrize("training", list(TRAININGS))
@pytest.mark.parametrize("name", list(SHAPES))
def test_cheap_double_backward_equals_stock(name, training):
    obs, candidate, y = _observation(name, TRAININGS[training])
    before = {k: v.clone() for k, v in obs.model.state_dict().items()}
    stock_update, stock_grad = _update_and_grad(UpdateSimulator(obs, cheap_double_backward=False),
                                                candidate, y, "backward")
    fast = UpdateSimulator(obs)
    assert fast.model is not obs.model
    assert any(type(m).__name__.startswith("TwiceDifferentiable") for m in fast.model.modules())
    assert all(not type(m).__name__.startswith("TwiceDifferentiable") for m in obs.model.modules())
    assert stock_grad.abs().max() > 0
    # the ways attacks back-propagate: all leaves, only the candidate, autograd.grad
    for how in ("backward", "backward-inputs", "grad") if training == "fedavg_tau2" else ("backward-inputs",):
        update, grad = _update_and_grad(fast, candidate, y, how)
        for n in stock_update:
            torch.testing.assert_close(update[n], stock_update[n], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grad, stock_grad, rtol=1e-8, atol=1e-12 * float(stock_grad.abs().max()))
    after = obs.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_soft_labels_and_nonleaf_candidate_get_stock_gradients():
    # DLG optimises soft labels; generator-based attacks feed a non-leaf candidate
    obs, candidate, y = _observation("convnet", TRAININGS["fedavg_tau2"])
    grads = []
    for cheap in (False, True):
        sim = UpdateSimulator(obs, cheap_double_backward=cheap)
        z = candidate.clone().requires_grad_(True)
        soft = torch.nn.functional.one_hot(y, 10).double().mul(3).requires_grad_(True)
        update = sim(torch.sigmoid(z), soft.softmax(-1))
        distance = update_distance(update, sim.target, "cosine")
        grads.append(torch.autograd.grad(distance, [z, soft]))
    for stock, fast in zip(*grads):
        torch.testing.assert_close(fast, stock, rtol=1e-8, atol=1e-14)


def test_first_order_use_of_the_copy_is_unchanged():
    # attacks also run plain forward/backward passes through `sim.model` (BN statistics)
    model = build_model(ModelSpec("resnet20", SHAPES["resnet20"], 10, seed=0)).double().train()
    fast = make_twice_differentiable(copy.deepcopy(model))
    x = torch.rand((3, *SHAPES["resnet20"]), dtype=torch.double, generator=torch.Generator().manual_seed(2))
    for m in (model, fast):
        m.zero_grad()
        m(x).logsumexp(-1).sum().backward()
    for (n, p), q in zip(model.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=n)
    model.eval(), fast.eval()
    torch.testing.assert_close(fast(x), model(x))


@pytest.mark.parametrize("weighted", [False, True])
def test_fused_cosine_distance_equals_autograd_reference(monkeypatch, weighted):
    # `_CosineDistance`'s hand-written gradient vs plain autograd on concatenated
    # vectors, in float64, through both reduction paths (concatenated small
    # tensors; chunked BLAS dots, with chunks made tiny so the split is exercised)
    monkeypatch.setattr(matching, "_FUSE_MIN", 0)
    monkeypatch.setattr(matching, "_SMALL", 64)
    monkeypatch.setattr(matching, "_CHUNK", 100)
    gen = torch.Generator().manual_seed(3)
    shapes = {"conv.weight": (6, 3, 3, 3), "conv.bias": (6,), "fc.weight": (10, 45), "fc.bias": (10,),
              "head.weight": (7, 33)}
    target = {n: torch.randn(s, generator=gen, dtype=torch.double) for n, s in shapes.items()}
    target["conv.bias"].zero_()  # an all-zero tensor (sparsified / frozen) must not matter
    base = {n: torch.randn(s, generator=gen, dtype=torch.double) for n, s in shapes.items()}
    weights = {"conv.weight": 2.5, "head.weight": 0.3, "fc.bias": 4.0} if weighted else None
    names = list(shapes)
    values, grads = [], []
    for fused in (True, False):
        cand = {n: t.clone().requires_grad_(True) for n, t in base.items()}
        # a non-contiguous candidate tensor, as a transposed weight gradient can be
        cand_in = dict(cand, **{"fc.weight": cand["fc.weight"].t().contiguous().t()})
        if fused:
            d = update_distance(cand_in, target, "weighted-cosine" if weighted else "cosine", weights)
            assert type(d.grad_fn).__name__.startswith("_CosineDistance")
        else:
            d = matching._cosine_reference([cand_in[n] for n in names], [target[n] for n in names],
                                           [(weights or {}).get(n, 1.0) for n in names])
        values.append(d.detach())
        grads.append(torch.autograd.grad(d * 3.0, [cand[n] for n in names]))
    torch.testing.assert_close(values[0], values[1], rtol=1e-12, atol=1e-14)
    for n, fast, ref in zip(names, *grads):
        assert ref.abs().max() > 0
        torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-14, msg=n)
    # a target modified in place is re-read, not served from the cache
    target["fc.weight"].mul_(-1)
    d = update_distance(base, target, "weighted-cosine" if weighted else "cosine", weights)
    ref = matching._cosine_reference([base[n] for n in names], [target[n] for n in names],
                                     [(weights or {}).get(n, 1.0) for n in names])
    torch.testing.assert_close(d, ref, rtol=1e-12, atol=1e-14)


def test_matching_iteration_with_fused_cosine_equals_reference(monkeypatch):
    # the whole IG step on an MLP's materialised update (the fused path) against the
    # autograd reference distance: the candidate's gradient is unchanged
    shape = (1, 8, 8)
    model = build_model(ModelSpec("mlp", shape, 10, seed=0)).double()
    gen = torch.Generator().manual_seed(4)
    x = torch.rand((4, *shape), generator=gen, dtype=torch.double)
    y = torch.randint(10, (4,), generator=gen)
    training = TrainingSpec(lr=0.1)
    obs = observe(compute_update(model, x, y, training), model, make_threat_model("honest"),
                  input_shape=shape, num_classes=10, training=training, batch_size=4, labels=y, defenses=[],
                  modality="image")
    sim = UpdateSimulator(obs, cheap_double_backward=False)  # materialised (not `factored`)
    assert sum(t.numel() for t in sim.target.values()) >= matching._FUSE_MIN
    candidate = torch.rand(x.shape, generator=gen, dtype=torch.double)
    grads = []
    for fused in (True, False):
        z = candidate.clone().requires_grad_(True)
        update = sim(z, y)
        if fused:
            d = update_distance(update, sim.target, "cosine")
        else:
            d = matching._cosine_reference(list(update.values()), [sim.target[n] for n in update],
                                           [1.0] * len(update))
        d.backward(inputs=[z])
        grads.append(z.grad)
    assert grads[1].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-14 * float(grads[1].abs().max()))
