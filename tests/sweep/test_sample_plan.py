"""The sample ladder's one planner (gradleak.sweep.sample_plan), which the sweep and the audit
both call: a setting with one open verdict gets the same rung from either."""
from gradleak.leakage import SAMPLE_SEED_OFFSET
from gradleak.sweep.sample_plan import examples_per_run, rung_seed, setting_target, verdict_target


def _entry(have: int, needed: int, attacks=None, open_: bool = True) -> dict:
    return {"open": open_, "ladder_have": have, "ladder_needed": needed, "ladder_attacks": attacks,
            "threat": "honest"}


def test_one_open_verdict_plans_the_same_rung_for_a_sweep_and_an_audit():
    for entry in (_entry(8, 40, ["ig"]), _entry(0, 3), _entry(8, 12, ["ig", "cpl"]), _entry(60, 200)):
        sweep, audit = verdict_target(entry, 64), setting_target([entry], 64)
        assert sweep is not None and audit is not None
        assert (sweep.have, sweep.target, sweep.attacks) == (audit.have, audit.target, audit.attacks)
    assert verdict_target(_entry(8, 40, ["ig"]), 64).target == 40  # as many as the rates need
    assert verdict_target(_entry(8, 12), 64).target == 16  # at least double
    assert verdict_target(_entry(60, 200), 64).target == 64  # never past the cap


def test_nothing_is_planned_where_the_verdict_is_decided_or_at_the_cap():
    assert verdict_target(_entry(8, 40, open_=False), 64) is None
    assert setting_target([_entry(8, 40, open_=False)], 64) is None
    assert verdict_target(_entry(64, 200), 64) is None and setting_target([_entry(64, 200)], 64) is None


def test_a_settings_verdicts_together_extend_every_attack_when_one_names_none():
    both = setting_target([_entry(8, 40, ["ig"]), _entry(4, 20, ["cpl"])], 64)
    assert both is not None and (both.have, both.target, both.attacks) == (4, 40, frozenset({"ig", "cpl"}))
    every = setting_target([_entry(8, 40, ["ig"]), _entry(4, 20)], 64)
    assert every is not None and every.attacks is None


def test_whole_batches_on_new_seeds():
    assert examples_per_run(32, 2, 4) == 16 and examples_per_run(33, 2, 4) == 20
    assert rung_seed(1, 2) == 1 + 2 * SAMPLE_SEED_OFFSET
