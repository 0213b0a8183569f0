"""The answer under a utility budget (issue 59): the cheapest setting that holds with its utility
loss's 95% upper bound within the budget, else both ways out; a setting under which the model no
longer learns is called unusable."""
from gradleak.analysis.wording import answer

SCENARIO = {"threat": "honest", "dataset": "mnist", "model": "lenet", "batch_size": 4, "local_steps": 1}


def _entry(defense: str, strength: str, verdict: str, loss: float, ci: float, grade=None, **extra) -> dict:
    return {**SCENARIO, "defense": defense, "strength": strength, "verdict": verdict, "grade": grade,
            "verdict_text": f"{verdict} ({defense} {strength})", "utility_metric": "test_accuracy",
            "utility_loss": loss, "utility_loss_ci": ci, "utility_resolved": True, **extra}


def _study(budget=None):
    entries = [_entry("none", "", "leaks", 0.0, 0.01, grade="recognizable"),
               _entry("noise", "sigma=0.01", "linkable", 0.004, 0.008, grade="linkable", worst_linkage=0.7),
               _entry("noise", "sigma=0.1", "holds", 0.05, 0.01),
               _entry("prune", "ratio=0.99", "holds", 0.46, 0.42,
                      unusable="the model no longer learns under it (accuracy 0.19 ≈ chance 0.1)")]
    for e in entries:
        if budget is not None:
            e["utility_budget"] = budget
    return entries


def test_without_a_budget_the_cheapest_that_holds_and_an_unusable_one_is_flagged():
    [plain] = answer(_study())
    assert plain["holds"] and plain["text"].startswith("cheapest defense that holds: noise sigma=0.1")
    [broken] = answer([e for e in _study() if e["strength"] != "sigma=0.1"])
    assert "prune ratio=0.99" in broken["text"] and "unusable: the model no longer learns" in broken["text"]


def test_a_budget_that_something_holds_within_names_it():
    [wide] = answer(_study(budget=0.1))  # sigma=0.1: 0.05 + 0.01 ≤ 0.1
    assert wide["holds"] and wide["text"].startswith("within a utility loss of 0.1 (at 95%), the cheapest defense "
                                                      "that holds: noise sigma=0.1")


def test_a_budget_nothing_holds_within_gives_both_ways_out():
    [tight] = answer(_study(budget=0.02))  # sigma=0.1 costs 0.05-0.06; within 0.02: none and sigma=0.01
    assert not tight["holds"]
    text = tight["text"]
    assert text.startswith("nothing tested holds within a utility loss of 0.02 (at 95%)")
    assert "within it, the least leaky is noise sigma=0.01" in text  # linkable beats recognizable
    assert "the cheapest that holds is noise sigma=0.1, utility loss 0.05 ± 0.01" in text
    # the undefended run costs nothing by definition; without it nothing fits a budget of 0.001
    [only_undefended] = answer(_study(budget=0.001))
    assert "within it, the least leaky is none" in only_undefended["text"]
    [none_fit] = answer([e for e in _study(budget=0.001) if e["defense"] != "none"])
    assert "no tested setting's utility loss is shown to be within it" in none_fit["text"]


def test_under_a_budget_a_loss_too_small_to_tell_from_nothing_is_still_placed_within_it():
    from gradleak.analysis.wording import loss_text

    tiny = _entry("noise", "sigma=0.01", "leaks", 0.0018, 0.006, utility_budget=0.02, utility_resolved=False)
    assert loss_text(tiny) == ", utility loss 0.0018 ± 0.006"
    straddling = {**tiny, "utility_loss": 0.018}  # 0.012–0.024: which side of 0.02 is open
    assert "not resolved" in loss_text({**straddling, "utility_resolved": False})
    assert "not resolved" in loss_text({k: v for k, v in tiny.items() if k != "utility_budget"})
