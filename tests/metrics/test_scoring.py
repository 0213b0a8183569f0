"""Aggregates that count every example, and an attack that says when it reconstructed nothing."""
import math
import subprocess
import sys

import pytest
import torch

from gradleak.attacks import AttackContext, make_attack
from gradleak.fl import TrainingSpec, compute_update
from gradleak.metrics import score_batch, summarize
from gradleak.metrics.image import psnr_from_mse
from gradleak.models import ModelSpec, build_model
from gradleak.threat import make_threat_model, observe


def test_one_failed_image_pulls_the_headline_psnr_down_to_its_level(mnist_test):
    x, y = mnist_test.inputs[:4], mnist_test.labels[:4]
    failed = torch.full_like(x[3:], 0.5)  # a flat grey image: a reconstruction that failed
    scores, _ = score_batch(x, y, torch.cat([x[:3], failed]), None, lpips="none", modality="image")
    bad = scores[3]
    assert [s.psnr for s in scores[:3]] == [100.0] * 3 and bad.psnr < 10
    summary = summarize(scores)
    # the mean of per-image PSNRs would read ~77 dB; the PSNR of the mean MSE is the failed
    # image's PSNR plus 10·log10(4) (its error spread over four images), nothing more
    assert summary["psnr"] == pytest.approx(psnr_from_mse(bad.mse / 4), abs=1e-3)
    assert summary["psnr"] == pytest.approx(bad.psnr + 10 * math.log10(4), abs=1e-3)
    assert summary["psnr_median"] == 100.0 and summary["psnr_max"] == 100.0
    assert summary["psnr_min"] == pytest.approx(bad.psnr)
    assert summary["asr"] == 0.75 and summary["matched"] == 1.0


def test_psnr_aggregate_keeps_the_per_image_cap():
    x = torch.rand(3, 1, 8, 8)
    summary = summarize(score_batch(x, torch.zeros(3), x.clone(), None, lpips="none", modality="image")[0])
    assert summary["psnr"] == summary["psnr_min"] == 100.0


def test_non_image_data_has_no_psnr():
    x = torch.rand(3, 5)
    summary = summarize(score_batch(x, torch.zeros(3), x + 0.1, None, modality="tabular", lpips="none")[0])
    assert summary["mse"] == pytest.approx(0.01, rel=1e-4)
    assert summary["psnr"] is summary["psnr_median"] is summary["psnr_min"] is summary["psnr_max"] is None


def _fished_observation(mnist_test, target, n=3):
    x, y = mnist_test.inputs[:n], mnist_test.labels[:n]  # labels 7 2 1
    mlp = build_model(ModelSpec("mlp", (1, 28, 28), 10, seed=0, options={"hidden": (256,)}))
    attack = make_attack(f"fishing:target_class={target}")
    model = attack.prepare_model(mlp, (1, 28, 28), 10, AttackContext()).model
    obs = observe(compute_update(model, x, y, TrainingSpec()), model, make_threat_model("malicious"),
                  input_shape=(1, 28, 28), num_classes=10, training=TrainingSpec(), batch_size=n,
                  labels=y, defenses=[], modality="image")
    return attack, obs, x, y


def test_fishing_without_the_target_class_says_it_reconstructed_nothing(mnist_test):
    attack, obs, x, y = _fished_observation(mnist_test, target=0)
    assert 0 not in y.tolist()
    with pytest.warns(UserWarning, match="nothing reconstructed") as caught:
        rec = attack.reconstruct(obs, AttackContext())
    assert rec.inputs.shape[0] == 0 and rec.extras["nothing_reconstructed"] is True
    # the classes the same update shows (from its head-bias gradient, not the labels)
    assert "classes 1, 2, 7" in rec.extras["message"] and rec.extras["message"] == str(caught[0].message)
    summary = summarize(score_batch(x, y, rec.inputs, rec.labels, lpips="none", modality="image")[0])
    assert summary["matched"] == 0.0 and summary["asr"] == 0.0 and summary["psnr"] < 15


def test_fishing_cli_prints_a_line_when_nothing_was_reconstructed(mnist_test):
    batch = 4
    order = torch.randperm(len(mnist_test), generator=torch.Generator().manual_seed(0))
    present = set(mnist_test.labels[order[:batch]].tolist())  # the run's batch (experiment.run_scenario)
    absent = min(set(range(10)) - present)
    # a subprocess: the CLI shows warnings on stderr, which pytest would otherwise collect
    proc = subprocess.run([sys.executable, "-m", "gradleak", "attack", "--dataset", "mnist", "--model", "mlp",
                           "--threat", "malicious", "--attack", f"fishing:target_class={absent}",
                           "--batch-size", str(batch), "--lpips", "none", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"nothing reconstructed: no example of target_class {absent}" in proc.stderr


def test_judged_examples_carry_their_linkage_and_recognisability():
    from gradleak.metrics.reidentify import Gallery
    from gradleak.metrics.scoring import RECOGNIZABLE_TABULAR_Z

    g = torch.Generator().manual_seed(0)
    records, gallery = torch.randn(4, 6, generator=g), Gallery(torch.randn(200, 6, generator=g), "records")
    # two records recovered to 0.1 sd, one to 1 sd (re-identified perhaps, not recognisable), none for the last
    noise = torch.randn(3, 6, generator=g)
    recovered = records[:3] + noise * torch.tensor([[0.1], [0.1], [1.0]])
    scores, _ = score_batch(records, torch.zeros(4), recovered, None, modality="tabular", lpips="none",
                            gallery=gallery)
    assert [s.recognizable for s in scores] == [True, True, False, False]
    assert scores[2].rmse_z > RECOGNIZABLE_TABULAR_Z and not scores[3].matched
    assert scores[3].linkage == 0.5 and scores[3].gallery_ranks == {"l2": 200, "l2z": 200}
    assert min(s.linkage for s in scores[:2]) == 1.0
    summary = summarize(scores)
    assert summary["recognizable"] == 0.5 and summary["linkage"] == pytest.approx(sum(s.linkage for s in scores) / 4)
    # an empty gallery judges nothing against it: ranks 0, no linkage
    empty, _ = score_batch(records, torch.zeros(4), records, None, modality="tabular", lpips="none",
                           gallery=Gallery(torch.zeros(0, 6), "none"))
    assert all(s.gallery_rank == 0 and s.linkage is None and s.recognizable for s in empty)
    assert summarize(empty)["linkage"] is None
