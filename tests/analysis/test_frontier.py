"""The utility–privacy frontier on the verdict's own measure (issue 59): linkage AUC, lower is
safer; MSE only for stores without linkage."""
from gradleak.analysis.costs import mark_frontier

SCENARIO = {"threat": "honest", "dataset": "mnist", "model": "lenet", "batch_size": 4, "local_steps": 1}


def _entry(defense, loss, linkage=None, mse=None):
    return {**SCENARIO, "defense": defense, "strength": "", "utility_loss": loss, "ev_linkage": linkage, "mse": mse}


def test_a_setting_is_on_the_frontier_unless_another_is_as_cheap_and_less_linkable():
    # the MSE would rank them the other way: the frontier follows the linkage AUC
    entries = [_entry("none", 0.0, 0.97, 0.01), _entry("sign", 0.012, 0.64, 0.2),
               _entry("prune", 0.012, 0.70, 0.5), _entry("dpsgd", 0.03, 0.77, 0.3), _entry("big", 0.05, 0.53, 0.1)]
    mark_frontier(entries)
    on = {e["defense"] for e in entries if e["frontier"]}
    assert on == {"none", "sign", "big"}  # prune: as cheap as sign, more linkable; dpsgd: dearer, more linkable


def test_without_linkage_the_best_attacks_mse_decides():
    entries = [_entry("none", 0.0, mse=0.001), _entry("noise", 0.3, mse=0.2), _entry("prune", 0.1, mse=0.05),
               _entry("sign", 0.2, mse=0.01)]
    mark_frontier(entries)
    assert {e["defense"] for e in entries if e["frontier"]} == {"none", "noise", "prune"}
