"""The guard's outbound half (the plain-PyTorch `guard`): an update the audit grades as leaking
is never sent as it is; the ladder is climbed until the audit passes, and the update is
withheld when even the top rung leaks. Every decision is a line of the log."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gradleak.fl import TrainingSpec, compute_update
from gradleak.guard import Guard, GuardConfig, guard, judge_update, update_evidence, update_leaks
from gradleak.leakage import Tolerance

FEDSGD = TrainingSpec(lr=0.1)


def _mlp(activation: type[nn.Module] = nn.ReLU) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), activation(), nn.Linear(16, 3))


def _one_example(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 1, 8, 8, generator=g), torch.tensor([2])


def _scores(n: int, linkage: float = 0.5, recognizable: int = 0, copies: int = 0, chance: float = 1 / 65):
    """Per-example scores as the scorer writes them: `n` examples judged among a gallery of 64."""
    return [{"success": k < copies, "gallery_rank": 0 if k < recognizable else 9, "linkage": linkage,
             "recognizable": k < recognizable, "reid_chance": chance} for k in range(n)]


def test_update_leaks_weighs_the_verdicts_evidence_against_its_tolerance():
    # a copy decides, whatever the rest
    leaks, reason = update_leaks(_scores(8, copies=1))
    assert leaks and reason.startswith("1 of 8 examples copied exactly")
    assert judge_update([("ig", update_evidence(_scores(8, copies=1)))]).beyond_chance
    # reconstructions that carry nothing: linkage 0.5, none recognizable
    assert update_leaks(_scores(8)) == (False, update_leaks(_scores(8))[1])
    assert not update_leaks(_scores(8))[0]
    # 1 of 8 recognizable is 12.5 %, above the default 10 %: not sent as it is; but one
    # recognised among 64 happens by chance (binomial tail 0.12 at 1/65, Holm x2): within chance
    grade = judge_update([("ig", update_evidence(_scores(8, recognizable=1)))])
    assert grade.leaks and grade.grade == "recognizable" and not grade.beyond_chance
    assert "1 of 8 examples recognizable (12.5%" in grade.reason and "within chance" in grade.reason
    grade = judge_update([("ig", update_evidence(_scores(8, recognizable=3)))])
    assert grade.leaks and grade.beyond_chance and "beyond chance" in grade.reason
    # within a tolerance of 20 %, 1 of 8 is no leak
    assert not update_leaks(_scores(8, recognizable=1), "recognizable=0.2")[0]
    # linkage: 0.65 over 8 examples is above 0.6 but within what chance gives (z = 1.47);
    # 0.9 is not; 0.58 is within the tolerance
    grade = judge_update([("ig", update_evidence(_scores(8, linkage=0.65)))])
    assert grade.leaks and grade.grade == "linkable" and not grade.beyond_chance
    assert judge_update([("ig", update_evidence(_scores(8, linkage=0.9)))]).beyond_chance
    assert not update_leaks(_scores(8, linkage=0.58))[0]
    assert not update_leaks(_scores(8, linkage=0.65), Tolerance(linkage=0.7))[0]
    # the same 0.65 over 64 examples is beyond chance
    assert judge_update([("ig", update_evidence(_scores(64, linkage=0.65)))]).beyond_chance
    # without a gallery only copies count
    bare = [{"success": False, "gallery_rank": None, "linkage": None}] * 8
    assert not update_leaks(bare)[0] and "only copies" in judge_update([("ig", update_evidence(bare))]).reason
    assert not update_leaks([])[0]


def _spread(n: int, mean: float, recognizable: int = 0):
    """`n` examples whose linkage AUCs spread ±0.3 around `mean` (a per-example AUC varies that
    much in the audits measured), `recognizable` of them recognised."""
    scores = _scores(n, recognizable=recognizable)
    for k, s in enumerate(scores):
        s["linkage"] = mean + (0.3 if k % 2 else -0.3)
    return update_evidence(scores)


def test_a_grade_is_decisive_where_it_holds_at_the_tolerances_level():
    """Within tolerance by the point estimates is decisive only where both rates' intervals lie
    within it; a leak, where an interval lies beyond it; a copy always."""
    assert judge_update([("ig", update_evidence(_scores(8, copies=1)))]).decisive
    # 400 examples at chance: linkage 0.50 ± 0.03, 0 recognizable (upper end 0.9 %): bounded
    grade = judge_update([("ig", _spread(400, 0.5))])
    assert not grade.leaks and grade.decisive and "bounded at its level" in grade.reason
    # 8 such examples: 0 of 8 recognizable has an upper end of 37 %, the linkage ± 0.25
    grade = judge_update([("ig", _spread(8, 0.5))])
    assert not grade.leaks and not grade.decisive and "by the point estimates" in grade.reason
    # every attack must bound it: one that judged 16 examples (0 of 16: up to 21 %) does not
    assert not judge_update([("ig", _spread(400, 0.5)), ("other", _spread(16, 0.5))]).decisive
    # 0.75 over 400 examples leaks beyond the interval; 0.62 over 400 (0.59-0.65) only by its point
    assert judge_update([("ig", _spread(400, 0.75))]).decisive
    grade = judge_update([("ig", _spread(400, 0.62))])
    assert grade.leaks and grade.beyond_chance and not grade.decisive
    # and without a gallery (only copies count) nothing is bounded
    bare = [{"success": False, "gallery_rank": None, "linkage": None}] * 8
    assert not judge_update([("ig", update_evidence(bare))]).decisive


def test_holm_corrects_over_the_audits_attacks():
    """linkage 0.72 over 8 examples: one-sided p 0.016; two tests of one attack make it
    0.031 (beyond chance at 95 %), eight tests of four attacks 0.12 (within chance)."""
    leaky = ("ig", update_evidence(_scores(8, linkage=0.72)))
    assert judge_update([leaky]).beyond_chance
    others = [(f"other{k}", update_evidence(_scores(8))) for k in range(3)]
    grade = judge_update([leaky, *others])
    assert grade.leaks and not grade.beyond_chance and grade.attack == "ig"


def test_the_top_rung_above_the_tolerance_within_chance_is_sent(monkeypatch):
    """The ladder's logic on given audits: a leak beyond chance climbs; at the top rung a leak
    within chance is sent under it (withholding would refuse it on chance), one beyond chance
    is withheld."""
    import gradleak.guard as guard_module
    from gradleak.guard.outbound import LadderAudit, OutboundAudit

    x, y = _one_example()
    update = compute_update(_mlp(), x, y, FEDSGD)
    for top, expected in (((True, False), ("within chance", True)), ((True, True), ("withheld", False))):
        audits = [OutboundAudit(True, "copies", beyond_chance=True), OutboundAudit(*top[:1], "top",
                                                                                  beyond_chance=top[1])]

        def walk(*args, checks, defend, client_state, audits=audits, **kwargs):
            states = [dict(client_state) for _ in checks]
            return LadderAudit(audits, [defend(c.rung, s) for c, s in zip(checks, states)], states)

        monkeypatch.setattr(guard_module, "audit_ladder", walk)
        decision = Guard(GuardConfig(ladder=["noise:sigma=0.01"]), training=FEDSGD).outbound(_mlp(), update, (x, y))
        assert (decision.grade, decision.send) == expected and decision.rung == 1
        assert decision.update is None or not torch.equal(decision.update.tensors["1.weight"],
                                                          update.tensors["1.weight"])


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
    assert "fc-analytic: 1 of 1 examples copied exactly" in decision.audits[0].reason
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


def test_the_guards_memory_is_a_plain_state_dict():
    """What a Guard remembers across rounds goes out as a plain dict and comes back into the
    Guard of the next round (the Flower mod builds one per round from `context.state`)."""
    x, y = _one_example()
    update = compute_update(_mlp(), x, y, FEDSGD)
    g = Guard(GuardConfig(ladder=["noise:sigma=1"], attacks=["fc-analytic"]), training=FEDSGD)
    g.inbound(_mlp(), 1)
    decision = g.outbound(_mlp(), update, (x, y), server_round=1)
    state = g.state_dict()
    assert set(state) == {"previous", "own_change", "rung", "withholding", "decisive", "audited_model",
                          "audited_norm", "audited_examples"}
    assert (state["rung"], state["withholding"]) == (decision.rung, False) == (1, False)
    again = Guard(g.config, training=FEDSGD, state=state)
    assert (again.rung, again.withholding) == (1, False)
    assert torch.equal(again.previous["1.weight"], _mlp().state_dict()["1.weight"])
    assert torch.equal(again.own_change["1.weight"], decision.update.tensors["1.weight"])
    assert Guard(g.config, training=FEDSGD, state={}).state_dict() == {
        "previous": None, "own_change": None, "rung": 0, "withholding": False, "decisive": False,
        "audited_model": None, "audited_norm": None, "audited_examples": None}


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


def test_between_audits_a_grown_update_or_fewer_examples_is_audited_anyway(tmp_path):
    x = torch.cat([_one_example(1)[0], _one_example(2)[0]])
    y = torch.tensor([2, 1])
    update = compute_update(_mlp(), x, y, FEDSGD)
    log = tmp_path / "guard.jsonl"
    config = GuardConfig(ladder=["noise:sigma=1"], attacks=["fc-analytic"], every=5, log=str(log))
    g = Guard(config, training=FEDSGD)
    assert g.outbound(_mlp(), update, (x, y), server_round=1).audits
    assert g.audited_norm == pytest.approx(float(update.flat().norm()), rel=1e-6) and g.audited_examples == 2
    # within the growth factor: screened, not audited
    smaller = update.replace(tensors={k: 1.2 * v for k, v in update.tensors.items()})
    assert not g.outbound(_mlp(), smaller, (x, y), server_round=2).audits
    grown = update.replace(tensors={k: 1.3 * v for k, v in update.tensors.items()})
    assert g.outbound(_mlp(), grown, (x, y), server_round=3).audits
    # the audit moved the reference: the same grown update is screened in the next round
    assert not g.outbound(_mlp(), grown, (x, y), server_round=4).audits
    one = compute_update(_mlp(), x[:1], y[:1], FEDSGD)
    assert g.outbound(_mlp(), one, (x[:1], y[:1]), server_round=5).audits
    # a model that moved: 3% of its norm is within the default 5%, 8% is not
    moved = _mlp()
    with torch.no_grad():
        total = sum(float(p.pow(2).sum()) for p in moved.parameters()) ** 0.5
        first = next(moved.parameters())
        direction = torch.ones_like(first) / first.numel() ** 0.5
        first += 0.03 * total * direction
    assert not g.outbound(moved, one, (x[:1], y[:1]), server_round=7).audits
    with torch.no_grad():
        first += 0.05 * total * direction
    assert g.outbound(moved, one, (x[:1], y[:1]), server_round=8).audits
    assert [json.loads(line)["audit"] for line in log.read_text().splitlines()] == [
        "scheduled", None, "grew ×1.30", None, "fewer examples", None, "model moved 8.0%"]
    # off: the grown update is not audited between scheduled rounds
    off = Guard(GuardConfig(ladder=["noise:sigma=1"], attacks=["fc-analytic"], every=5, growth=0), training=FEDSGD)
    off.outbound(_mlp(), update, (x, y), server_round=1)
    assert not off.outbound(_mlp(), grown.replace(tensors={k: 10 * v for k, v in grown.tensors.items()}), (x, y),
                            server_round=2).audits


def test_after_a_decisive_audit_a_moved_model_waits_for_the_scheduled_audit(monkeypatch):
    """The screen's drift test is for decisions near the tolerance: after an audit whose every
    grade held at the tolerance's level, a round whose model moved is sent under the chosen
    rung until the scheduled audit; a grown update or fewer examples is still audited."""
    import gradleak.guard as guard_module
    from gradleak.guard.outbound import LadderAudit, OutboundAudit

    x, y = _one_example()
    update = compute_update(_mlp(), x, y, FEDSGD)
    moved = _mlp()
    with torch.no_grad():
        for p in moved.parameters():
            p.mul_(1.5)  # 50 % of its norm
    for decisive in (True, False):
        def walk(*args, checks, defend, client_state, decisive=decisive, **kwargs):
            # the update as trained leaks beyond its interval; the first rung is bounded within it
            audits = [OutboundAudit(True, "copies", beyond_chance=True, decisive=True),
                      OutboundAudit(False, "bounded", decisive=decisive)]
            return LadderAudit(audits, [defend(c.rung, dict(client_state)) for c in checks[:2]],
                               [dict(client_state)] * 2, passed=1)

        monkeypatch.setattr(guard_module, "audit_ladder", walk)
        g = Guard(GuardConfig(ladder=["noise:sigma=1"], every=5), training=FEDSGD)
        assert g.outbound(_mlp(), update, (x, y), server_round=1).rung == 1 and g.decisive == decisive
        between = g.outbound(moved, update, (x, y), server_round=2)
        assert bool(between.audits) != decisive
        if decisive:
            assert "decided at the tolerance's level" in between.reason and "moved" not in between.reason
            grown = update.replace(tensors={k: 2 * v for k, v in update.tensors.items()})
            assert g.outbound(moved, grown, (x, y), server_round=3).audits  # more signal under the rung's noise
            assert g.outbound(moved, grown, (x, y), server_round=6).audits  # scheduled


def test_an_update_sent_as_trained_is_not_audited_for_growing(monkeypatch):
    """With no defense on the update there is no noise for a larger update to outgrow (the
    attacks match its direction): between audits, only a defended rung's update is audited for
    its growth."""
    import gradleak.guard as guard_module
    from gradleak.guard.outbound import LadderAudit, OutboundAudit

    def walk(*args, checks, defend, client_state, **kwargs):
        return LadderAudit([OutboundAudit(False, "bounded", decisive=True)],
                           [defend(checks[0].rung, dict(client_state))], [dict(client_state)], passed=0)

    monkeypatch.setattr(guard_module, "audit_ladder", walk)
    x, y = _one_example()
    update = compute_update(_mlp(), x, y, FEDSGD)
    g = Guard(GuardConfig(ladder=["noise:sigma=1"], every=5), training=FEDSGD)
    assert g.outbound(_mlp(), update, (x, y), server_round=1).rung == 0
    grown = update.replace(tensors={k: 3 * v for k, v in update.tensors.items()})
    between = g.outbound(_mlp(), grown, (x, y), server_round=2)
    assert not between.audits and between.update is grown and "grew" not in between.reason


def test_a_client_first_seen_between_scheduled_rounds_is_audited():
    x, y = _one_example()
    update = compute_update(_mlp(), x, y, FEDSGD)
    g = Guard(GuardConfig(ladder=["noise:sigma=1"], attacks=["fc-analytic"], every=5), training=FEDSGD)
    decision = g.outbound(_mlp(), update, (x, y), server_round=3)
    assert decision.audits and decision.rung == 1  # fc-analytic copies the plain update: never sent as it is


def test_after_a_withholding_audit_the_rounds_until_the_next_withhold_too():
    x, y = _one_example(2)
    update = compute_update(_mlp(), x, y, FEDSGD)
    g = Guard(GuardConfig(ladder=["noise:sigma=0.000001"], attacks=["fc-analytic"], every=2), training=FEDSGD)
    decisions = [g.outbound(_mlp(), update, (x, y), server_round=r) for r in (1, 2, 3)]
    assert [(d.send, d.grade, bool(d.audits)) for d in decisions] == [
        (False, "withheld", True), (False, "withheld", False), (False, "withheld", True)]
    assert "the last audit withheld" in decisions[1].reason


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

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "flower_text"))
    from flower_text.task import Net, client_data, held_out_sequences

    from gradleak.data.text import VOCAB_SIZE

    x, y = client_data(0, 8, {"seed": 0, "seq-len": 16, "sequences-per-client": 4})
    training = TrainingSpec(lr=0.01, local_epochs=1, local_batch_size=8)
    update = compute_update(Net(0), x, y, training)
    decision = guard(Net(0), update, (x, y), training=training, gallery=held_out_sequences(200),
                     num_classes=VOCAB_SIZE, tokenizer="gpt2", config=GuardConfig())
    assert decision.audits[0].leaks and "dager: 4 of 4 examples copied exactly" in decision.audits[0].reason
    assert decision.send and decision.rung >= 1
    assert any("tag" in s and "FedAvg" in s for s in decision.audits[-1].skipped)


def test_the_time_budget_is_kept_inside_an_attack():
    """An IG of 100,000 iterations against a budget of 2 s: the attack stops where it is, the
    audit ends within the budget (plus the selection and judging around it), and an attack cut
    short decides nothing about the update: the guard says the budget was spent inside it."""
    import time

    g = torch.Generator().manual_seed(4)
    x, y = torch.rand(4, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 1])
    update = compute_update(_mlp(nn.Sigmoid), x, y, FEDSGD)
    config = GuardConfig(ladder=["noise:sigma=1"], attacks=["ig:iterations=100000"], time_budget=2.0)
    start = time.perf_counter()
    decision = guard(_mlp(nn.Sigmoid), update, (x, y), training=FEDSGD, config=config)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0 * 1.1 + 3.0, elapsed  # the budget + 10%, and a few seconds outside the attack
    [audit] = decision.audits
    assert audit.budget_spent and "spent inside ig" in audit.reason


def test_an_attack_cut_by_its_deadline_is_not_called_saturated(mnist_test):
    import time

    from gradleak.api import audit_update
    from gradleak.models import ModelSpec, build_model

    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    x, y = mnist_test.inputs[:2], mnist_test.labels[:2]
    update = compute_update(model, x, y, FEDSGD, modality="image")
    start = time.perf_counter()
    result = audit_update(model, update, x, y, training=FEDSGD, attacks=["ig:iterations=100000"], lpips="none",
                          time_budget=1.5)
    assert time.perf_counter() - start < 1.5 * 1.1 + 3.0
    [run] = result.runs
    assert run.extras["ladder"]["decision"] == "out of time" and not run.extras["ladder"]["saturated"]
