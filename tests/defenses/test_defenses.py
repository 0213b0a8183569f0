"""Defenses: what each does to the update, what it does to an attack, bad options, FedAvg utility."""
import math
import subprocess
import sys

import pytest
import torch

from gradleak.defenses import make_chain, make_defense
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models import ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, run_attack
from gradleak.utility import UtilitySpec, dirichlet_partition, run_utility

FEDSGD = TrainingSpec()
RELU_LENET = {"init": "default"}
# CPL (L-BFGS, L2 matching, patterned init), cut short: converges on undefended MNIST LeNet batch 1.
FAST_ATTACK = "cpl:iterations=60"


def _model(spec_chain=None, activation="relu"):
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, activation=activation, seed=0, options=dict(RELU_LENET)))
    return spec_chain.transform_model(model) if spec_chain is not None else model


def _update(mnist_test, defense, n=4, training=FEDSGD, seed=1, state=None):
    chain = make_chain([defense] if defense else [])
    model = _model(chain)
    x, y = mnist_test.inputs[:n], mnist_test.labels[:n]
    return compute_update(model, x, y, training, chain, torch.Generator().manual_seed(seed), state)


@pytest.fixture(scope="module")
def plain(mnist_test):
    return _update(mnist_test, None)


def test_noise_std_and_snr(mnist_test, plain):
    noisy = _update(mnist_test, "noise:sigma=0.05")
    diff = noisy.flat() - plain.flat()
    assert abs(float(diff.std()) - 0.05) < 0.002 and abs(float(diff.mean())) < 0.002
    for snr in (0.0, -10.0):
        noisy = _update(mnist_test, f"noise:snr_db={snr}")
        noise = noisy.flat() - plain.flat()
        measured = 10 * math.log10(float(plain.flat().pow(2).mean() / noise.pow(2).mean()))
        assert abs(measured - snr) < 0.2
    lap = _update(mnist_test, "laplace:sigma=0.05").flat() - plain.flat()
    assert abs(float(lap.std()) - 0.05) < 0.003
    kurtosis = float((lap / lap.std()).pow(4).mean())
    assert 5 < kurtosis < 7  # Laplace: 6, Gaussian: 3


def test_clip_bounds_norm(mnist_test, plain):
    assert abs(_update(mnist_test, "clip:bound=0.1").norm() - 0.1) < 1e-5
    assert torch.allclose(_update(mnist_test, "clip:bound=100").flat(), plain.flat())


def test_sparsifiers_exact_ratios(mnist_test, plain):
    flat = plain.flat()
    top = _update(mnist_test, "topk:sparsity=0.9").flat()
    kept = top != 0
    assert abs(float(kept.float().mean()) - 0.1) < 1e-3
    assert float(flat[kept].abs().min()) >= float(flat[~kept].abs().max())  # global magnitude order
    assert torch.equal(top[kept], flat[kept])
    pruned = _update(mnist_test, "prune:ratio=0.75")
    for name, t in pruned.tensors.items():  # per layer
        expected = t.numel() - round(0.25 * t.numel())
        assert int((t == 0).sum()) >= expected - int((plain.tensors[name] == 0).sum()) and \
            abs(int((t != 0).sum()) - round(0.25 * t.numel())) <= max(1, int((plain.tensors[name] == 0).sum()))
    dropped = _update(mnist_test, "dropout:p=0.3").flat()
    zeros = float(((dropped == 0) & (flat != 0)).float().sum() / (flat != 0).float().sum())
    assert abs(zeros - 0.3) < 0.01
    assert torch.equal(dropped[dropped != 0], flat[dropped != 0])


def test_dgc_accumulates_residual(mnist_test, plain):
    state = {}
    first = _update(mnist_test, "dgc:theta=40", state=state)
    sent = first.flat()
    residual = torch.cat([r.reshape(-1) for r in state[0]["residual"].values()])
    assert torch.allclose(sent + residual, plain.flat())  # nothing lost, only delayed
    assert abs(float((residual != 0).float().mean()) - 0.4) < 0.13  # ReLU's exact zeros count as withheld
    second = _update(mnist_test, "dgc:theta=40", state=state).flat()
    residual2 = torch.cat([r.reshape(-1) for r in state[0]["residual"].values()])
    assert torch.allclose(second + residual2, plain.flat() + residual)


def test_quantizers_levels_and_sign(mnist_test, plain):
    q = _update(mnist_test, "quantize:bits=3")
    for name, t in q.tensors.items():
        levels = torch.unique(t)
        assert len(levels) <= 7  # 2s+1 with s = 3
        step = float(plain.tensors[name].abs().max()) / 3
        assert torch.allclose(levels / step, (levels / step).round(), atol=1e-4)
        assert float((t - plain.tensors[name]).abs().max()) <= step / 2 + 1e-6
    qs = [_update(mnist_test, "qsgd:bits=2", seed=s) for s in range(40)]
    for name, t in qs[0].tensors.items():
        assert len(torch.unique(t)) <= 3
    mean = torch.stack([u.flat() for u in qs]).mean(0)  # unbiased
    error = float((mean - plain.flat()).abs().mean())
    assert error < 0.5 * float((qs[0].flat() - plain.flat()).abs().mean())
    sign = _update(mnist_test, "sign:scale=none")
    assert torch.equal(sign.flat(), torch.sign(plain.flat()))


def test_dpsgd_clips_per_example_and_noise_std(mnist_test):
    x, y = mnist_test.inputs[:4], mnist_test.labels[:4]
    clean = _update(mnist_test, "dpsgd:clip=1e-3,sigma=0")
    per_example = [compute_update(_model(), x[i:i + 1], y[i:i + 1], FEDSGD) for i in range(4)]
    expected = sum(u.flat() * min(1.0, 1e-3 / u.norm()) for u in per_example) / 4
    assert torch.allclose(clean.flat(), expected, atol=1e-7)
    noisy = _update(mnist_test, "dpsgd:clip=1e-3,sigma=2")
    assert abs(float((noisy.flat() - clean.flat()).std()) - 2 * 1e-3 / 4) < 2e-5
    cdp = _update(mnist_test, "fedcdp:clip=1e-3,sigma=0")
    manual = 0
    for u in per_example:
        manual = manual + torch.cat([t.reshape(-1) * min(1.0, 1e-3 / float(t.norm())) for t in u.tensors.values()])
    assert torch.allclose(cdp.flat(), manual / 4, atol=1e-7)
    eps = [make_defense(f"dpsgd:sigma={s}").privacy(sample_rate=0.05, steps=100, delta=1e-5) for s in (0.8, 1.5, 3)]
    assert eps[0] > eps[1] > eps[2] > 0


def test_secagg_sums_clients_and_soteria_prunes_head(mnist_test, plain):
    assert make_chain(["secagg:clients=5"]).aggregate_clients == 5
    sot = _update(mnist_test, "soteria:rate=0.8")
    head = sot.tensors["7.weight"]
    zero_columns = int((head == 0).all(0).sum())
    assert zero_columns >= round(0.8 * head.shape[1])
    for name in sot.tensors:
        if name != "7.weight":
            assert torch.equal(sot.tensors[name], plain.tensors[name])


def test_model_and_data_defenses(mnist_test):
    chain = make_chain(["precode:bottleneck=16"])
    model = _model(chain)
    names = [n for n, _ in model.named_parameters()]
    assert any("encoder" in n for n in names) and any("decoder" in n for n in names)
    a = _update(mnist_test, "precode:bottleneck=16", seed=1)
    b = _update(mnist_test, "precode:bottleneck=16", seed=1)
    assert torch.equal(a.flat(), b.flat())  # deterministic
    x, y = mnist_test.inputs[:8], mnist_test.labels[:8]
    mix = make_chain(["mixup:k=2"])
    from gradleak.defenses import DefenseContext
    mx, my = mix.transform_batch(x, y, DefenseContext(torch.Generator().manual_seed(0), model=_model()))
    assert my.shape == (8, 10) and torch.allclose(my.sum(1), torch.ones(8))
    assert not torch.allclose(mx, x) and float(mx.min()) >= 0
    ix, _ = make_chain(["instahide:k=4"]).transform_batch(x, y, DefenseContext(torch.Generator().manual_seed(0),
                                                                                model=_model()))
    assert float((ix < 0).float().mean()) > 0.3  # random sign flips
    dropped = _update(mnist_test, "dropout:p=0.5,place=model")
    assert "7.1.weight" in dropped.tensors


@pytest.mark.parametrize("bad", ["noise:sigma=-1", "dropout:p=1.5", "prune:ratio=-0.1", "quantize:bits=0",
                                 "qsgd:bits=0", "dgc:theta=100", "topk:sparsity=2", "dpsgd:clip=0",
                                 "fedcdp:sigma=-1", "secagg:clients=0", "soteria:rate=1.2", "noise:bogus=1",
                                 "mixup:k=0", "instahide:alpha=0", "sign:scale=foo", "precode:bottleneck=0"])
def test_bad_parameters(bad):
    with pytest.raises(GradleakError):
        make_defense(bad)


def test_bad_parameter_cli_exit_code():
    proc = subprocess.run([sys.executable, "-m", "gradleak", "utility", "--defense", "dropout:p=2", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "p must be" in proc.stderr


def _attack(defenses=(), local_steps=1, images=1, attack=FAST_ATTACK):
    spec = AttackRunSpec(dataset="mnist", model="lenet", attack=attack, defenses=tuple(defenses), images=images,
                         local_steps=local_steps, lr=0.1, lpips="none")
    return run_attack(spec).metrics


def test_noise_level_decides_attack():
    small = _attack(["noise:sigma=1e-4"])
    large = _attack(["noise:sigma=1e-2"])
    assert small["psnr"] > 35 and small["asr"] == 1.0, small
    assert large["asr"] == 0.0 and large["psnr"] < small["psnr"] - 10, large


def test_pruning_hurts_attack():
    light = _attack(["prune:ratio=0.1"], images=1)
    heavy = _attack(["prune:ratio=0.99"], images=1)
    assert light["psnr"] > heavy["psnr"] + 8, (light, heavy)


def test_attack_matches_only_the_entries_a_sparsifier_sent():
    # Wei et al. Tab. 7: DGC compression up to 40% leaves CPL's success intact once the
    # attack (knowing the protocol) compares only the transmitted entries.
    compressed = _attack(["dgc:theta=40"])
    assert compressed["asr"] == 1.0 and compressed["psnr"] > 30, compressed


def test_sent_entries_masks_only_for_sparsifiers(mnist_test):
    from gradleak.attacks.replay.matching import sent_entries
    from gradleak.threat import ThreatModel, observe

    def observation(defense, grants=frozenset({"batch_size", "defenses"})):
        update = _update(mnist_test, defense, n=1)
        return observe(update, _model(), ThreatModel("t", grants), input_shape=(1, 28, 28), num_classes=10,
                       training=FEDSGD, batch_size=1, labels=mnist_test.labels[:1], defenses=[defense],
                       modality="image")

    obs = observation("topk:sparsity=0.9")
    masks = sent_entries(obs, obs.update.tensors)
    sent = sum(float(m.sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())
    assert abs(sent - 0.1) < 0.01
    assert all(torch.equal(m.bool(), obs.update.tensors[n] != 0) for n, m in masks.items())
    assert sent_entries(observation("noise:sigma=0.01"), obs.update.tensors) is None
    assert sent_entries(observation("dropout:p=0.3,place=model"), obs.update.tensors) is None
    # A server that is not told the defenses cannot know which entries were withheld.
    hidden = observation("topk:sparsity=0.9", grants=frozenset({"batch_size"}))
    assert sent_entries(hidden, hidden.update.tensors) is None


def test_utility_is_deterministic_and_learns():
    spec = UtilitySpec(clients=20, per_round=4, rounds=3, local_steps=20, seed=3)
    a, b = run_utility(spec), run_utility(spec)
    assert a.test_accuracy == b.test_accuracy and a.train_loss == b.train_loss
    assert a.test_accuracy > 0.3  # random: 0.1
    dp = run_utility(UtilitySpec(clients=20, per_round=4, rounds=2, local_steps=3, seed=3,
                                 defenses=("dpsgd:clip=1,sigma=1",)))
    assert dp.epsilon is not None and 0 < dp.epsilon < math.inf


def test_dirichlet_partition_is_non_iid(mnist_test):
    shards = dirichlet_partition(mnist_test.labels, 10, 0.1, 0)
    assert sum(len(s) for s in shards) == len(mnist_test)
    assert len(set(torch.cat(shards).tolist())) == len(mnist_test)
    top_share = [float(torch.bincount(mnist_test.labels[s], minlength=10).max()) / max(1, len(s)) for s in shards]
    assert sum(top_share) / len(top_share) > 0.5
