"""The sample ladder's one planner (gradleak.sweep.sample_plan), which the sweep and the audit
both call: a setting with one open verdict gets the same rung from either."""
from gradleak.leakage import SAMPLE_SEED_OFFSET
from gradleak.sweep.sample_plan import (
    every_attack_target,
    examples_per_run,
    rung_seed,
    setting_target,
    verdict_target,
)


def _entry(have: int, needed: int, attacks=None, open_: bool = True, least: int | None = None,
           others_need: int = 0) -> dict:
    return {"open": open_, "ladder_have": have, "ladder_needed": needed, "ladder_attacks": attacks,
            "threat": "honest", "min_examples": have if least is None else least, "needed_examples": others_need}


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


def test_the_last_rung_extends_every_attack_beside_the_focused_one():
    # CPL measured above the tolerance on 96 examples and was the focus; IG sits at 8 and needs 150
    focused = _entry(96, 400, ["cpl"], least=8, others_need=150)
    assert verdict_target(focused, 192).attacks == frozenset({"cpl"})
    every = every_attack_target(focused, 192)
    assert every is not None and every.attacks is None and (every.have, every.target) == (8, 192)
    assert every_attack_target(_entry(8, 40, open_=False), 64) is None
    # the audit's planner, on its last rung, the same
    last = setting_target([focused], 192, last=True)
    assert last is not None and last.attacks is None and (last.have, last.target) == (8, 192)
    assert setting_target([focused], 192).attacks == frozenset({"cpl"})


def test_a_sweeps_last_rung_runs_every_attack_of_a_focused_setting():
    from gradleak.analysis.cells import SCENARIO_KEYS
    from gradleak.sweep.samples import extension_cells
    from gradleak.sweep.spec import SampleLadder, parse_sweep

    sweep = parse_sweep("""name: study
grids:
  - datasets: [mnist]
    models: [lenet]
    defenses: [noise:sigma=0.3]
    attacks: [ig:iterations=4, cpl:iterations=4]
""", "study.yaml")
    cell = next(c for c in sweep.cells if c.kind == "attack")
    entry = {**{k: cell.labels.get(k) for k in SCENARIO_KEYS}, "defense": cell.labels["defense"],
             "strength": cell.labels["strength"], **_entry(16, 400, ["cpl:iterations=4"], least=8, others_need=60)}
    seen = {(tuple(cell.labels.get(k) for k in SCENARIO_KEYS[1:]) + (entry["defense"], entry["strength"]), a): n
            for a, n in (("cpl:iterations=4", 16), ("ig:iterations=4", 8))}
    ladder = SampleLadder(rungs=2, max_examples=64)

    def attacks_of(rung: int) -> set[str]:
        return {c.labels["attack_spec"] for c in extension_cells(sweep.cells, [entry], seen, rung, ladder)}
    assert attacks_of(1) == {"cpl:iterations=4"}  # a rung with one after it: the focused attack only
    assert attacks_of(2) == {"cpl:iterations=4", "ig:iterations=4"}  # the last: every attack
