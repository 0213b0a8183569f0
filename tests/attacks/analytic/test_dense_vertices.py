"""dense-vertices: a FedAvg client's examples through the vertices of its first dense layer's row
space, on real MNIST digits and a ReLU LeNet-5 trained as an app trains (several local steps,
order unknown)."""
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from gradleak.api import select_attacks
from gradleak.attacks import AttackContext, make_attack
from gradleak.attacks.analytic.dense_vertices import distinct, merge_for
from gradleak.data import DatasetSpec, load_dataset
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec, compute_update
from gradleak.metrics.image import psnr
from gradleak.models.references import build_named_model
from gradleak.solvers.features import FeatureExtractor
from gradleak.threat import make_threat_model, observe

SMALL = "dense-vertices:starts=2000,realizable=200,realizable_steps=300"
CLIENT = TrainingSpec(lr=0.004, local_epochs=2, local_batch_size=5, optimizer="sgd", shuffle="unknown")


@pytest.fixture(scope="module")
def mnist_train():
    return load_dataset(DatasetSpec("mnist", split="train"))


def _client(mnist_test, mnist_train, seed, prior=True, images=10, digits=None):
    """The client of model seed `seed` on the test digits drawn by `digits` (default: `seed`)."""
    pick = torch.randperm(len(mnist_test.labels),
                          generator=torch.Generator().manual_seed(seed if digits is None else digits))[:images]
    x, y = mnist_test.inputs[pick], mnist_test.labels[pick]
    model = build_named_model("lenet5:activation=relu", (1, 28, 28), 10, seed=seed, modality="image")
    update = compute_update(model, x, y, CLIENT, generator=torch.Generator().manual_seed(seed + 11))
    held_out = None
    if prior:
        rows = torch.randperm(len(mnist_train.labels), generator=torch.Generator().manual_seed(seed + 7))[:5000]
        held_out = mnist_train.subset(rows)
    obs = observe(update, model, make_threat_model("honest", ["prior_data"] if prior else []),
                  input_shape=(1, 28, 28), num_classes=10, training=CLIENT.server_view(), batch_size=images,
                  labels=y, defenses=[], prior_data=held_out, modality="image")
    return model, x, y, obs


@pytest.mark.slow
@pytest.mark.parametrize("seed, prior", [(0, True), (1, False)])
def test_recovers_the_features_and_the_digits_of_a_fedavg_client(mnist_test, mnist_train, seed, prior):
    # 10 digits, 2 epochs of mini-batches of 5, order unknown. Seeds 0-3 with held-out digits as
    # starts: 10, 9, 10, 9 of 10 features within cosine 0.98 of the truth, median PSNR 20.2, 19.1,
    # 15.3, 17.3 dB, labels right on all; from pen strokes and photographs, 300 of them refined
    # in pixels: 10, 10, 10, 10 and 20.0, 17.5, 14.9, 17.1 dB (photographs alone, unrefined: 9,
    # 9, 10, 7). Those PSNRs were measured with the inversion's TV at 0.1; TV 0.05 (the default
    # since 2026-12-01) changes only the inversion, not the features. Bars: 7 features, 14 dB.
    torch.set_num_threads(1)
    model, x, y, obs = _client(mnist_test, mnist_train, seed, prior)
    attack = make_attack(SMALL if prior else SMALL + ",refined=300")
    found = next(iter(attack.search(obs, AttackContext(seed=seed))))
    assert found.extras["start_source"] == ("prior_data" if prior else "strokes-and-photos")
    assert found.extras["refined"] == (0 if prior else 300)
    true = FeatureExtractor(model, found.extras["layer"])(x)
    cosine = torch.nn.functional.normalize(found.features, dim=1) @ torch.nn.functional.normalize(true, dim=1).T
    assert int((cosine.max(1).values > 0.98).sum()) >= 7, cosine.max(1).values
    assert torch.equal(found.labels.sort().values, y.sort().values)
    # the images, matched to the digits by PSNR
    pairs = torch.tensor([[psnr(a[None], b[None]) for b in x] for a in found.images])
    rows, cols = linear_sum_assignment(-pairs.numpy())
    assert float(pairs[rows, cols].median()) >= 14.0, pairs[rows, cols]


@pytest.mark.slow
def test_the_features_are_not_found_in_an_update_of_other_digits(mnist_test, mnist_train):
    """The features come from the update: against another client's update of other digits the
    chosen features are far from this client's."""
    torch.set_num_threads(1)
    model, x, _, _ = _client(mnist_test, mnist_train, 0)
    _, other_x, _, other = _client(mnist_test, mnist_train, 0, digits=5)
    assert not any(bool((a == b).all()) for a in x for b in other_x)
    found = next(iter(make_attack(SMALL).search(other, AttackContext(seed=0))))
    true = FeatureExtractor(model, found.extras["layer"])(x)
    cosine = torch.nn.functional.normalize(found.features, dim=1) @ torch.nn.functional.normalize(true, dim=1).T
    assert int((cosine.max(1).values > 0.98).sum()) <= 1


def test_refuses_what_it_cannot_attack(mnist_test, mnist_train):
    attack = make_attack("dense-vertices")
    mlp = build_named_model("mlp", (1, 28, 28), 10, modality="image")
    assert "behind convolutions" in attack.unsupported(mlp, (1, 28, 28), 10, "image")
    sigmoid = build_named_model("lenet5", (1, 28, 28), 10, modality="image")
    assert "ReLU" in attack.unsupported(sigmoid, (1, 28, 28), 10, "image")
    with pytest.raises(GradleakError, match="zeros"):
        make_attack("dense-vertices:zeros=abc")
    # more examples than the layer has units cannot be separated
    _, _, _, obs = _client(mnist_test, mnist_train, 0, images=10)
    obs = observe(obs.update, obs.model, make_threat_model("honest"), input_shape=(1, 28, 28), num_classes=10,
                  training=CLIENT.server_view(), batch_size=200, labels=torch.zeros(200, dtype=torch.long),
                  defenses=[], modality="image")
    with pytest.raises(GradleakError, match="too few"):
        attack.reconstruct(obs, AttackContext(seed=0))


def test_auto_runs_it_where_a_relu_dense_layer_follows_convolutions():
    threat = make_threat_model("honest")
    relu = build_named_model("lenet5:activation=relu", (1, 28, 28), 10, modality="image")
    ran, _ = select_attacks("auto", relu, (1, 28, 28), 10, "image", threat, training=CLIENT, samples=50)
    assert any(s.startswith("dense-vertices") for s in ran)
    sigmoid = build_named_model("lenet5", (1, 28, 28), 10, modality="image")
    _, skipped = select_attacks("auto", sigmoid, (1, 28, 28), 10, "image", threat, training=CLIENT, samples=50)
    assert "ReLU" in {s.attack.split(":")[0]: s.reason for s in skipped}["dense-vertices"]


def test_each_rung_refines_its_share_of_new_starts(mnist_test, mnist_train):
    """Without prior_data a rung of twice the starts also refines twice as many, the new ones
    drawn from its new starts; with prior_data nothing is refined."""
    _, _, _, honest = _client(mnist_test, mnist_train, 0, prior=False)
    tiny = ("dense-vertices:starts=100,refined=30,refine_rounds=1,refine_steps=1,realizable=0,"
            "feature_steps=1,rounds=2")
    rungs = make_attack(tiny).search(honest, AttackContext(seed=0))
    first, second = next(rungs), next(rungs)
    assert (first.extras["starts"], first.extras["refined"]) == (100, 30)
    assert (second.extras["starts"], second.extras["refined"]) == (200, 60)
    # every start and every refined start yields one vertex per zero count
    assert len(second.pooled) == (200 + 60) * len(second.extras["zeros"])
    # the merge the choice used is reported, never below the option's floor
    assert 0.98 <= first.extras["merge"] < 1
    _, _, _, informed = _client(mnist_test, mnist_train, 0)
    assert next(iter(make_attack(tiny).search(informed, AttackContext(seed=0)))).extras["refined"] == 0


def test_the_merge_rises_where_the_examples_are_alike():
    # 20 examples whose features share most of their direction (nearest other example at cosine
    # about 0.975, as a LeNet-5 at some initialisations makes MNIST digits), each reached as 5
    # vertices within about 0.996 of one another. A fixed merge of 0.96 keeps every other example
    # out once one is chosen; halfway from the vertices' typical cosine to 1 keeps one vertex per
    # example.
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(400, generator=g)
    shared = shared / shared.norm()
    examples = shared + 0.16 * torch.randn(20, 400, generator=g) / 20
    found = examples.repeat_interleave(5, 0) + 0.06 * torch.randn(100, 400, generator=g) / 20
    unit = torch.nn.functional.normalize(found, dim=1)
    owner = torch.arange(20).repeat_interleave(5)
    near = torch.nn.functional.normalize(examples, dim=1) @ torch.nn.functional.normalize(examples, dim=1).T
    assert 0.96 < float(near.fill_diagonal_(-1).amax(1).median()) < 0.99
    order = torch.randperm(100, generator=g)
    merge = merge_for(unit, 0.96)
    assert 0.98 < merge < 0.995, merge
    assert len(set(owner[distinct(unit, order, 20, merge)].tolist())) == 20
    assert len(distinct(unit, order, 20, 0.96)) < 5
    # vertices of examples that are not alike keep the floor
    spread = torch.nn.functional.normalize(torch.rand(100, 400, generator=g), dim=1)
    assert merge_for(spread, 0.96) == 0.96
