"""The guard's inbound checks: models crafted by gradleak's own malicious attacks (Robbing the
Fed, class fishing, MKOR) are flagged, honest FedAvg models are not, and bad guard
configuration is one line before any round."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gradleak.attacks import make_attack
from gradleak.attacks.base import AttackContext
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec
from gradleak.guard import Guard, GuardConfig, check_received
from gradleak.guard.trajectory import honest_fedavg
from gradleak.models import ModelSpec, build_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MNIST = (1, 28, 28)


def _cnn(seed: int = 0) -> nn.Module:
    """The Flower example's sigmoid CNN (examples/flower_audit), rebuilt here."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                         nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                         nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid(), nn.Flatten(),
                         nn.Linear(12 * 7 * 7, 10))


def _clients(count: int = 4, examples: int = 6, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(examples, *MNIST, generator=g), torch.randint(0, 10, (examples,), generator=g))
            for _ in range(count)]


def _momentum(round_: int, client: int) -> TrainingSpec:
    return TrainingSpec(lr=0.05, optimizer="sgd:momentum=0.9,weight_decay=0.0005", local_epochs=2,
                        local_batch_size=4, shuffle_seed=1000 * round_ + client)


@pytest.fixture(scope="module")
def cnn_rounds():
    return list(honest_fedavg(_cnn(), _clients(), _momentum, 4))


def _crafted(spec: str, model: nn.Module, seed: int = 0) -> nn.Module:
    return make_attack(spec).prepare_model(model, MNIST, 10, AttackContext(seed=seed)).model


def _model(state, factory=_cnn) -> nn.Module:
    model = factory()
    model.load_state_dict(state)
    return model


def test_honest_rounds_raise_nothing(cnn_rounds):
    for before, now in zip(cnn_rounds, cnn_rounds[1:]):
        report = check_received(now.received, before.received, before.updates[0].tensors)
        assert not report.crafted, report.summary()
        assert report.compared_with_previous
    assert not check_received(cnn_rounds[0].received).crafted


def test_the_score_is_each_checks_margin_below_one_for_honest_rounds_and_at_least_one_where_one_fires(cnn_rounds):
    honest = [check_received(now.received, before.received, before.updates[0].tensors)
              for before, now in zip(cnn_rounds, cnn_rounds[1:])]
    for report in honest:
        assert 0 < report.score < 1 and set(report.margins) >= {"rank_one", "duplicate_rows", "scale_jump",
                                                                   "change_beyond_fedavg"}
    for spec in ("rtf", "fishing", "loki:bins=256"):
        crafted = check_received(_crafted(spec, _model(cnn_rounds[2].received)), cnn_rounds[1].received,
                                 cnn_rounds[1].updates[0].tensors)
        assert crafted.crafted and crafted.score >= 1
        for check in crafted.checks:  # every check that fired is at or past its threshold
            assert crafted.margins[check] >= 1, (spec, check, crafted.margins)
    # exact repeats and a new structure are infinitely past their thresholds; JSON says "inf"
    rtf = check_received(_crafted("rtf", _model(cnn_rounds[2].received)), cnn_rounds[1].received)
    assert rtf.margins["structure"] == float("inf") and rtf.to_dict()["score"] == "inf"


def test_a_check_margin_follows_its_statistic():
    from gradleak.guard.inbound import RANK_ONE_RATIO, row_findings

    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(8, 1, generator=g).double(), torch.randn(1, 16, generator=g).double()
    for noise, fires in ((0.0, True), (1e-5, True), (1e-1, False)):
        margins: dict = {}
        matrix = u @ v + noise * torch.randn(8, 16, generator=g).double()
        found = row_findings("w", matrix, None, margins)
        assert ("rank_one" in {f.check for f in found}) is fires
        assert (margins["rank_one"] >= 1) is fires
        if 0 < noise:
            singular = torch.linalg.svdvals(matrix)
            assert margins["rank_one"] == pytest.approx(RANK_ONE_RATIO / float(singular[1] / singular[0]), rel=1e-6)


@pytest.mark.parametrize("spec", ["rtf", "rtf:bins=16,query=gaussian"])
def test_robbing_the_fed_is_a_binning_layer(cnn_rounds, spec):
    crafted = _crafted(spec, _model(cnn_rounds[2].received))
    alone = check_received(crafted)  # round 1: nothing to compare with
    assert {"duplicate_rows", "rank_one"} <= set(alone.checks)
    assert any("binning layer" in f.detail for f in alone.findings if f.tensor == "imprint.weight")
    with_previous = check_received(crafted, cnn_rounds[1].received, cnn_rounds[1].updates[0].tensors)
    assert "structure" in with_previous.checks  # the imprint block is new


def test_loki_twin_banks_are_a_binning_layer(cnn_rounds):
    crafted = _crafted("loki:bins=256", _model(cnn_rounds[2].received))
    alone = check_received(crafted)
    assert "duplicate_rows" in alone.checks
    assert any("binning layer" in f.detail for f in alone.findings if f.tensor == "imprint.weight")
    with_previous = check_received(crafted, cnn_rounds[1].received, cnn_rounds[1].updates[0].tensors)
    assert "structure" in with_previous.checks


@pytest.mark.parametrize("spec", ["fishing", "fishing:target_class=3,fish_bias=5"])
def test_class_fishing_zeroes_the_head(cnn_rounds, spec):
    crafted = _crafted(spec, _model(cnn_rounds[2].received))
    report = check_received(crafted, cnn_rounds[1].received, cnn_rounds[1].updates[0].tensors)
    assert {"zero_rows", "rank_one", "scale_jump"} <= set(report.checks)
    assert "9 of 10 rows exactly zero" in str(report.findings)


@pytest.mark.parametrize("spec", ["mkor", "mkor:noise=0.1,shuffle=false"])
def test_mkor_copy_filters_and_owned_rows(spec):
    def lenet5():
        return build_model(ModelSpec("lenet5", MNIST, 10, seed=0))

    rounds = list(honest_fedavg(lenet5(), _clients(count=2), _momentum, 2))
    crafted = _crafted(spec, _model(rounds[1].received, lenet5))
    report = check_received(crafted, rounds[0].received, rounds[0].updates[0].tensors)
    assert {"one_tap_rows", "duplicate_rows", "change_beyond_fedavg"} <= set(report.checks)
    assert not check_received(rounds[1].received, rounds[0].received, rounds[0].updates[0].tensors).crafted


def test_a_fully_zero_tensor_and_one_zero_row_are_honest():
    model = nn.Sequential(nn.Embedding(50, 16, padding_idx=0), nn.Linear(16, 8))
    nn.init.zeros_(model[1].weight)  # a zero-initialised branch (LoRA's B)
    assert not check_received(model).crafted
    with torch.no_grad():
        model[0].weight[1:3] = 0  # two more zero rows are not a padding index
    assert check_received(model).checks == ["zero_rows"]


def test_guard_keeps_the_last_clean_model_as_reference(cnn_rounds, tmp_path):
    log = tmp_path / "guard.jsonl"
    g = Guard(GuardConfig(log=str(log)), training=_momentum(1, 0))
    assert not g.inbound(cnn_rounds[0].received, 1).crafted
    assert g.inbound(_crafted("fishing", _model(cnn_rounds[1].received)), 2).crafted
    # the crafted model does not become the reference: the next honest one compares with round 1's
    assert not g.inbound(cnn_rounds[1].received, 3).crafted
    assert torch.equal(g.previous["7.weight"], cnn_rounds[1].received["7.weight"])
    lines = log.read_text().splitlines()
    assert len(lines) == 3 and '"grade": "crafted"' in lines[1] and '"round": 2' in lines[1]


@pytest.mark.parametrize("config, message", [
    ({"ladder": ["noise:sigma=0.01", "blur:radius=2"]}, "ladder rung 2 (blur:radius=2): unknown defense 'blur'"),
    ({"tolerance": "linkage=1.5"}, "guard: tolerance linkage must be above 0.5 and below 1, got 1.5"),
    ({"tolerance": "recognizable=-0.1"}, "guard: tolerance recognizable must be above 0 and below 1"),
    ({"tolerance": "level=0.3"}, "guard: tolerance level must be above 0.5"),
    ({"tolerance": "linkage=high"}, "guard: tolerance linkage must be a number, got 'high'"),
    ({"tolerance": "share=0.1"}, "guard: tolerance key 'share' unknown"),
    ({"tolerance": 0.1}, "guard: tolerance must be the verdict's, e.g. linkage=0.6"),
    ({"ladder": "noise:sigma=0.01; noise:sigma=0.001"}, "not increasing at rung 2"),
    ({"ladder": ["clip:bound=1", "clip:bound=2"]}, "bound goes from 1.0 to 2.0, a weaker setting"),
    ({"ladder": ["noise:sigma=0.01", "noise:sigma=0.01"]}, "no stronger than the rung below"),
    ({"ladder": ["noise:sigma=0.01", "clip:bound=1"]}, "the same defenses in the same order"),
    ({"ladder": ["noise:sigma=-1"]}, "sigma must be >= 0"),
    ({"ladder": []}, "the defense ladder is empty"),
    ({"every": 0}, "every must be a whole number of rounds >= 1"),
    ({"growth": 0.9}, "growth must be 0 (off) or a factor >= 1, got 0.9"),
    ({"growth": float("inf")}, "growth must be 0 (off) or a factor >= 1"),
    ({"drift": -0.1}, "drift must be a share >= 0 (0: off), got -0.1"),
    ({"attacks": ["ig:iterations=50", "blah"]}, "guard: attack 'blah': unknown attack 'blah'"),
    ({"strongest": ("ig:foo=1",)}, "guard: attack 'ig:foo=1': attack 'ig' has no option 'foo'"),
    ({"time_budget": 0}, "time_budget must be a positive number"),
    ({"on_crafted": "ignore"}, "on_crafted must be one of refuse, safe_copy"),
])
def test_bad_configuration_is_one_line(config, message):
    with pytest.raises(GradleakError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")) as info:
        GuardConfig(**config)
    assert "\n" not in str(info.value)


def test_increasing_ladders_are_accepted():
    config = GuardConfig(ladder="clip:bound=2+noise:sigma=0.001; clip:bound=1+noise:sigma=0.001; "
                                "clip:bound=1+noise:sigma=0.01")
    assert [r.text for r in config.rungs][-1] == "clip:bound=1+noise:sigma=0.01"
    assert GuardConfig(ladder=["topk:sparsity=0.5", "topk:sparsity=0.9"]).rungs[1].text == "topk:sparsity=0.9"
    # a rung that acts during training needs the client's training, said before any round
    dp = GuardConfig(ladder=["dpsgd:sigma=0.5", "dpsgd:sigma=1"])
    with pytest.raises(GradleakError, match="acts during training"):
        Guard(dp)
    Guard(dp, training=TrainingSpec(lr=0.1))


def test_a_defense_from_outside_orders_its_own_rungs(monkeypatch):
    """A new defense declares its strength in its own class: the guard's ladder orders it with
    nothing else edited (as it does noise, whose strength an SNR setting takes away)."""
    from dataclasses import dataclass

    from gradleak.defenses import DEFENSES
    from gradleak.defenses.base import Defense

    @dataclass
    class ShrinkOptions:
        keep: float = 1.0

    class Shrink(Defense):
        """Scales the update by `keep` (smaller keeps less)."""

        name = "shrink-for-guard-test"
        Options = ShrinkOptions
        strength = ("keep", -1)

        def transform_update(self, update, ctx):
            return update.map(lambda _, t: t * self.options.keep)

    DEFENSES.names()  # the installed plugins read, then the registry restored after this test
    monkeypatch.setattr(DEFENSES, "_paths", dict(DEFENSES._paths))
    DEFENSES.register(Shrink.name, Shrink)
    rungs = GuardConfig(ladder=[f"{Shrink.name}:keep=0.5", f"{Shrink.name}:keep=0.1"]).rungs
    assert [r.text for r in rungs] == [f"{Shrink.name}:keep=0.5", f"{Shrink.name}:keep=0.1"]
    with pytest.raises(GradleakError, match="keep goes from 0.1 to 0.5, a weaker setting"):
        GuardConfig(ladder=[f"{Shrink.name}:keep=0.1", f"{Shrink.name}:keep=0.5"])
    with pytest.raises(GradleakError, match="'noise' has no strength order"):
        GuardConfig(ladder=["noise:snr_db=20", "noise:snr_db=10"])


@pytest.mark.slow
@pytest.mark.parametrize("app", ["images", "text"])
def test_no_false_alarm_over_20_honest_rounds_of_each_example(app, monkeypatch):
    """The example apps' own model, data and training, 20 FedAvg rounds simulated with
    gradleak's client (examples/flower_audit: 10 clients; examples/flower_text: 8)."""
    monkeypatch.syspath_prepend(str(EXAMPLES / ("flower_audit" if app == "images" else "flower_text")))
    if app == "images":
        from flower_audit.task import client_data, initial_model, shuffle_seed

        # the example's small configuration (its test model, 8 examples per client)
        config = {"seed": 0, "dirichlet-alpha": 0.5, "examples-per-client": 8, "model": "sigmoid-cnn"}
        clients = [client_data(i, 10, config) for i in range(10)]
        model = initial_model(config)

        def training(r, c):
            return TrainingSpec(lr=0.05, optimizer="sgd:momentum=0.9,weight_decay=0.0005", local_epochs=2,
                                local_batch_size=32, shuffle_seed=shuffle_seed(config, r, c))
    else:
        from flower_text.task import Net, client_data

        config = {"seed": 0, "seq-len": 16, "sequences-per-client": 4}
        clients = [client_data(i, 8, config) for i in range(8)]
        model = Net(0)

        def training(r, c):
            return TrainingSpec(lr=0.01, local_epochs=1, local_batch_size=8)
    watched = (0, len(clients) - 1)
    guards = {c: Guard(GuardConfig(), training=training(1, c)) for c in watched}
    for now in honest_fedavg(model, clients, training, 20, keep=watched):
        for client, g in guards.items():
            report = g.inbound(now.received, now.number)
            assert not report.crafted, f"round {now.number}: {report.summary()}"
            g.own_change = now.updates[client].tensors
    for name in [n for n in sys.modules if n.startswith(("flower_audit", "flower_text"))]:
        monkeypatch.delitem(sys.modules, name)
