"""The guard's outbound half (the plain-PyTorch `guard`): an update the audit grades as leaking
is never sent as it is; the ladder is climbed until the audit passes, and the update is
withheld when even the top rung leaks. Every decision is a line of the log."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gradleak.fl import TrainingSpec, compute_update
from gradleak.guard import Guard, GuardConfig, guard, update_leaks

FEDSGD = TrainingSpec(lr=0.1)


def _mlp(activation: type[nn.Module] = nn.ReLU) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), activation(), nn.Linear(16, 3))


def _one_example(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 1, 8, 8, generator=g), torch.tensor([2])


def test_update_leaks_counts_copies_and_reidentifications():
    copy_ = {"success": True, "gallery_rank": 0}
    found = {"success": False, "gallery_rank": 0}
    missed = {"success": False, "gallery_rank": 7}
    assert update_leaks([copy_] + [missed] * 7, 0.0)[0]
    leaks, reason = update_leaks([copy_, found] + [missed] * 6, 0.2)
    assert leaks and reason.startswith("2 of 8 examples exposed (1 copied exactly, 2 re-identified)")
    assert not update_leaks([copy_] + [missed] * 7, 0.2)[0]  # 12.5 % within a 20 % tolerance
    assert not update_leaks([missed] * 8, 0.0)[0]
    assert not update_leaks([], 0.0)[0]
    # among a gallery of 64 (chance 1/65), one of 8 re-identified is what chance gives; three is not
    chance = {"reid_chance": 1 / 65}
    one = [{**found, **chance}] + [{**missed, **chance}] * 7
    leaks, reason = update_leaks(one, 0.0)
    assert not leaks and "1 re-identified, within chance" in reason
    assert update_leaks([{**found, **chance}] * 3 + [{**missed, **chance}] * 5, 0.0)[0]
    assert update_leaks([{**copy_, **chance}] + [{**missed, **chance}] * 7, 0.0)[0]  # a copy always counts


def test_a_batch_one_dense_layer_climbs_the_ladder(tmp_path):
    """One example through a dense first layer: fc-analytic copies it exactly (weight row over
    bias entry). Noise of 1e-6 does not stop the copy; noise of 1 does."""
    x, y = _one_example()
    update = compute_update(_mlp(), x, y, FEDSGD)
    log = tmp_path / "guard.jsonl"
    config = GuardConfig(ladder=["noise:sigma=0.000001", "noise:sigma=1"], attacks=["fc-analytic"], log=str(log))
    decision = guard(_mlp(), update, (x, y), training=FEDSGD, config=config)
    assert decision.send and decision.rung == 2 and decision.rung_text == "noise:sigma=1"
    assert [a.leaks for a in decision.audits] == [True, True, False]
    assert "1 of 1 examples exposed (1 copied exactly" in decision.audits[0].reason
    sent = decision.update.tensors["1.weight"]
    assert not torch.equal(sent, update.tensors["1.weight"])
    assert 0.8 < float((sent - update.tensors["1.weight"]).std()) < 1.2  # the rung's noise, sigma 1
    record = json.loads(log.read_text().splitlines()[-1])
    assert record["stage"] == "outbound" and record["rung"] == 2 and record["sent"] is True
    assert [a["leaks"] for a in record["audits"]] == [True, True, False]
    assert record["seconds"] > 0 and record["round"] == 1


def test_the_top_rung_leaking_withholds_the_update(tmp_path):
    x, y = _one_example(2)
    update = compute_update(_mlp(), x, y, FEDSGD)
    config = GuardConfig(ladder=["noise:sigma=0.0000001", "noise:sigma=0.000001"], attacks=["fc-analytic"])
    decision = guard(_mlp(), update, (x, y), training=FEDSGD, config=config)
    assert not decision.send and decision.update is None and decision.grade == "withheld"
    assert "the top rung still leaks" in decision.reason


def test_an_update_that_does_not_leak_goes_out_untouched():
    """Four examples through a sigmoid dense layer: every unit sees all four, so fc-analytic
    finds one mixture per row and copies none (with ReLU, a unit that only one example
    activates would copy it), and no rung is needed."""
    g = torch.Generator().manual_seed(4)
    x, y = torch.rand(4, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 1])
    update = compute_update(_mlp(nn.Sigmoid), x, y, FEDSGD)
    config = GuardConfig(ladder=["noise:sigma=1"], attacks=["fc-analytic"])
    decision = guard(_mlp(nn.Sigmoid), update, (x, y), training=FEDSGD, config=config)
    assert decision.send and decision.rung == 0 and decision.update is update
    assert decision.grade == "within tolerance"


def test_every_kth_round_keeps_the_last_rung_between_audits(tmp_path):
    x, y = _one_example()
    update = compute_update(_mlp(), x, y, FEDSGD)
    log = tmp_path / "guard.jsonl"
    g = Guard(GuardConfig(ladder=["noise:sigma=1"], attacks=["fc-analytic"], every=2, log=str(log)),
              training=FEDSGD)
    assert g.outbound(_mlp(), update, (x, y), server_round=1).rung == 1
    between = g.outbound(_mlp(), update, (x, y), server_round=2)
    assert between.grade == "not audited" and between.rung == 1 and not between.audits
    assert not torch.equal(between.update.tensors["1.weight"], update.tensors["1.weight"])
    assert g.outbound(_mlp(), update, (x, y), server_round=3).audits  # audited again
    assert [json.loads(line)["grade"] for line in log.read_text().splitlines()] == [
        "within tolerance", "not audited", "within tolerance"]


def test_a_dpsgd_rung_retrains_the_client():
    x, y = _one_example()
    update = compute_update(_mlp(), x, y, FEDSGD)
    g = Guard(GuardConfig(ladder=["dpsgd:clip=0.1,sigma=0.5", "dpsgd:clip=0.1,sigma=5"], attacks=["fc-analytic"]),
              training=FEDSGD)
    retrained = g.defended(1, _mlp(), update, x, y, FEDSGD, 1)
    # per-example clipping to 0.1 plus noise: another update than the plain one
    assert float((retrained.flat() - update.flat()).norm()) > 0.05
    decision = g.outbound(_mlp(), update, (x, y))
    assert decision.send and decision.rung >= 1


def test_a_crafted_received_model_is_never_answered():
    x, y = _one_example()
    honest = _mlp()
    fished = _mlp()
    with torch.no_grad():
        fished[3].weight[1:] = 0
    update = compute_update(fished, x, y, FEDSGD)
    decision = guard(fished, update, (x, y), training=FEDSGD, previous=honest,
                     config=GuardConfig(attacks=["fc-analytic"]))
    assert not decision.send and decision.grade == "crafted" and "zero_rows" in decision.reason


@pytest.mark.parametrize("bad", [{"attacks": ["fc-analytic"], "ladder": ["mixup"]}])
def test_a_data_place_rung_needs_the_training(bad):
    from gradleak.errors import GradleakError

    with pytest.raises(GradleakError, match="acts during training"):
        Guard(GuardConfig(**bad))


@pytest.mark.slow
def test_the_text_example_is_not_sent_while_dager_copies_it(monkeypatch):
    """examples/flower_text's first round for one client: DAGER's span test copies its 4
    sequences from the plain update, so the guard climbs to the first noise rung, where
    DAGER copies none (TAG, the optimisation attack, does not take FedAvg updates)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples" / "flower_text"))
    from flower_text.task import Net, client_data, held_out_sequences

    from gradleak.data.text import VOCAB_SIZE

    x, y = client_data(0, 8, {"seed": 0, "seq-len": 16, "sequences-per-client": 4})
    training = TrainingSpec(lr=0.01, local_epochs=1, local_batch_size=8)
    update = compute_update(Net(0), x, y, training)
    decision = guard(Net(0), update, (x, y), training=training, gallery=held_out_sequences(200),
                     num_classes=VOCAB_SIZE, tokenizer="gpt2", config=GuardConfig())
    assert decision.audits[0].leaks and "4 of 4 examples exposed (4 copied exactly" in decision.audits[0].reason
    assert decision.send and decision.rung >= 1
    assert any("tag" in s and "FedAvg" in s for s in decision.audits[-1].skipped)
