"""FedLeak (Fan et al., USENIX Security 2025): its two engine objectives — partial gradient
matching and gradient regularisation — and the attack on real MNIST digits, on a FedSGD
gradient and a FedAvg delta."""
import math

import pytest
import torch

from gradleak.attacks import AttackContext, make_attack
from gradleak.attacks.engine.candidates import FixedLabels, Pixels
from gradleak.attacks.engine.engine import Engine, Optimizer
from gradleak.attacks.engine.objectives import GradientRegularisation, Matching, PartialDistance
from gradleak.attacks.replay.matching import UpdateSimulator, update_distance
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec, compute_update
from gradleak.metrics import score_batch
from gradleak.models import ModelSpec, build_model
from gradleak.threat import make_threat_model, observe

DISTANCES = ("cosine", "layer-cosine", "l1+layer-cosine", "l2", "l1")


def _updates(seed=0):
    gen = torch.Generator().manual_seed(seed)
    simulated = {"w": torch.randn(6, 5, generator=gen), "b": torch.randn(7, generator=gen)}
    target = {n: torch.randn(t.shape, generator=gen) for n, t in simulated.items()}
    return simulated, target


@pytest.mark.parametrize("distance", DISTANCES)
def test_partial_matching_ignores_the_entries_it_does_not_select(distance):
    simulated, target = _updates()
    partial = PartialDistance(keep=0.5, distance=distance)
    base = partial(simulated, target)
    noise = torch.Generator().manual_seed(1)
    for name, g in simulated.items():
        chosen = partial.mask(g)
        # the half of the simulated tensor's entries largest in magnitude
        assert int(chosen.sum()) == math.ceil(g.numel() / 2)
        assert g.abs()[chosen].min() > g.abs()[~chosen].max()
        moved = dict(target)
        moved[name] = torch.where(chosen, target[name], target[name] + 5 * torch.randn(g.shape, generator=noise))
        assert torch.equal(partial(simulated, moved), base), name
        # one selected entry of the target moved: the objective moves
        index = chosen.reshape(-1).nonzero()[0, 0]
        moved[name] = target[name].clone().reshape(-1)
        moved[name][index] += 1.0
        moved[name] = moved[name].view_as(g)
        assert abs(float(partial(simulated, moved) - base)) > 1e-4, name
    # no gradient reaches the simulated entries left out
    leaves = {n: t.clone().requires_grad_(True) for n, t in simulated.items()}
    partial(leaves, target).backward()
    for name, leaf in leaves.items():
        assert torch.all(leaf.grad[~partial.mask(simulated[name])] == 0), name
        assert leaf.grad[partial.mask(simulated[name])].abs().sum() > 0, name


def test_partial_matching_by_the_targets_magnitudes_and_keeping_everything():
    simulated, target = _updates(2)
    partial = PartialDistance(keep=0.25, select="target", distance="cosine")
    base = partial(simulated, target)
    for name, t in target.items():
        chosen = partial.mask(t)
        assert int(chosen.sum()) == math.ceil(t.numel() / 4)
        # shrinking the unselected target entries keeps them unselected and unmatched
        moved = {**target, name: torch.where(chosen, t, 0.5 * t)}
        assert torch.equal(partial(simulated, moved), base), name
        moved = {**target, name: torch.where(chosen, 2 * t, t)}
        assert abs(float(partial(simulated, moved) - base)) > 1e-4, name
    # keep=1 is the plain distance
    for distance in ("cosine", "layer-cosine", "l2"):
        assert torch.allclose(PartialDistance(keep=1.0, distance=distance)(simulated, target),
                              update_distance(simulated, target, distance))
    with pytest.raises(GradleakError, match="keep must be in"):
        PartialDistance(keep=0)


def test_partial_matching_of_a_simulated_lenet_gradient(mnist_test):
    """Through `Matching` and the simulator: the entries the candidate's own gradient leaves
    out may take any value in the observed update."""
    x, y = mnist_test.inputs[:2], mnist_test.labels[:2]
    model = build_model(ModelSpec("lenet", mnist_test.input_shape, mnist_test.num_classes, seed=0))
    update = compute_update(model, x, y, TrainingSpec())
    obs = observe(update, model, make_threat_model("honest"), input_shape=mnist_test.input_shape,
                  num_classes=mnist_test.num_classes, training=TrainingSpec(), batch_size=2, labels=y, defenses=[],
                  modality=mnist_test.modality)
    sim = UpdateSimulator(obs)
    partial = PartialDistance()
    candidate = torch.rand((2, *mnist_test.input_shape), generator=torch.Generator().manual_seed(0))
    simulated = {n: t.detach() for n, t in sim(candidate, y).items()}
    scrambled, pushed = {}, {}
    for name, t in sim.target.items():
        chosen = partial.mask(simulated[name])
        scrambled[name] = torch.where(chosen, t, -3 * t + t.abs().max())
        pushed[name] = torch.where(chosen, -t, t)
    base = float(Matching(sim, sim.target, partial)(candidate, y).detach())
    assert float(Matching(sim, scrambled, partial)(candidate, y).detach()) == pytest.approx(base, rel=1e-6)
    assert float(Matching(sim, pushed, partial)(candidate, y).detach()) > base + 0.1


def _toy_engine(regulariser, optimizer="sgd", lr=0.1):
    target = torch.tensor([1.0, -2.0, 0.5])
    start = torch.tensor([0.0, 0.0, 0.0])
    engine = Engine(matching=Matching(lambda x, y: {"w": x}, {"w": target}, "l2"), labels=FixedLabels(torch.zeros(1)),
                    candidates=lambda r: Pixels(start), optimizer=Optimizer(optimizer, lr), iterations=1,
                    regulariser=regulariser)
    return engine, start, target


@pytest.mark.parametrize("probe", ["step", "ascent"])
def test_gradient_regularisation_mixes_the_gradient_at_the_probe_point(probe):
    # D(x) = ‖x − t‖², g = 2(x − t). step: the probe is SGD's own step x − lr·g, where the gradient
    # is g(1 − 2lr); ascent: x + r·g/‖g‖, where it is g + 2r·g/‖g‖. One SGD step follows the mix
    # 0.7·g + 0.3·g(probe), from the point and optimizer state before the probe.
    lr, r = 0.1, 0.01
    engine, start, target = _toy_engine(GradientRegularisation(0.3, probe, r), lr=lr)
    out = engine.run()
    g = 2 * (start - target)
    at_probe = g * (1 - 2 * lr) if probe == "step" else g + 2 * r * g / g.norm()
    assert torch.allclose(out.inputs, start - lr * (0.7 * g + 0.3 * at_probe), atol=1e-6)
    assert out.evaluations == 2  # the gradient at the point and at the probe
    plain, _, _ = _toy_engine(None, lr=lr)
    assert torch.allclose(plain.run().inputs, start - lr * g, atol=1e-6)
    with pytest.raises(GradleakError, match="not lbfgs"):
        _toy_engine(GradientRegularisation(), optimizer="lbfgs")[0].run()
    with pytest.raises(GradleakError, match="weight must be in"):
        GradientRegularisation(weight=1.5)


def _attack(dataset, spec, batch, seed, training=TrainingSpec()):
    x, y = dataset.inputs[:batch], dataset.labels[:batch]
    model = build_model(ModelSpec("lenet", dataset.input_shape, dataset.num_classes, seed=0))
    update = compute_update(model, x, y, training)
    obs = observe(update, model, make_threat_model("honest"), input_shape=dataset.input_shape,
                  num_classes=dataset.num_classes, training=training, batch_size=batch, labels=y, defenses=[],
                  modality=dataset.modality)
    rec = make_attack(spec).reconstruct(obs, AttackContext(seed=seed))
    scores, _ = score_batch(x, y, rec.inputs, rec.labels, lpips="none", modality="image")
    return rec, scores


def test_fedleak_reconstructs_two_mnist_digits_from_a_gradient(mnist_test):
    # MNIST test digits 0-1 in one batch, sigmoid LeNet, 1500 iterations (one thread, ~6 s);
    # mean PSNR over the two digits on seeds 0-4: 20.91 / 20.63 / 19.27 / 18.43 / 18.80 dB
    # (lowest single digit 18.28). IG at 3000 iterations, the same number of gradient evaluations
    # (two a step here): 17.46 / 19.41 / 19.59 on seeds 0-2
    rec, scores = _attack(mnist_test, "fedleak:iterations=1500", batch=2, seed=0)
    assert min(s.psnr for s in scores) >= 17, [s.psnr for s in scores]
    assert all(s.recovered_label == s.label for s in scores)
    assert rec.extras["evaluations"] == 2 * 1500  # two gradients a step: at the point and at the probe


def test_fedleak_reconstructs_a_fedavg_delta(mnist_test):
    # τ = 3 local steps at lr 0.1, one digit, 600 iterations (~8 s): 26.46 / 26.57 / 24.51 dB on seeds 0-2
    # where first measured; on a 2-core AMD EPYC with AVX2 (2026-12-01) 20.12 / 26.91 / 22.72 / 20.82 dB
    # on seeds 0-3, so the bar sits 2 dB under the lowest of both machines' runs
    _, scores = _attack(mnist_test, "fedleak:iterations=600", batch=1, seed=0,
                        training=TrainingSpec(lr=0.1, local_steps=3))
    assert scores[0].psnr >= 18, scores[0].psnr


@pytest.mark.parametrize("spec, message", [
    ("fedleak:keep=0", "keep must be in"),
    ("fedleak:keep=1.5", "keep must be in"),
    ("fedleak:regularise=2", "regularise must be in"),
    ("fedleak:radius=0", "radius must be > 0"),
    ("fedleak:probe=sideways", "not one of"),
    ("fedleak:distance=l1+cosine", "not one of"),
])
def test_fedleak_option_validation(spec, message):
    with pytest.raises(GradleakError, match=message):
        make_attack(spec)
