"""A new defense is one file: a class written outside gradleak, registered at run time, is in
the guard's defense ladder (ordered by the strength it declares) and in the two-layer analysis
(by the map it declares), with nothing inside gradleak edited."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from gradleak.defenses import DEFENSES, Defense, make_chain
from gradleak.errors import GradleakError
from gradleak.guard import GuardConfig
from gradleak.theory.bounds import lower_bound
from gradleak.theory.defenses import covered_defenses, parse_defense
from gradleak.theory.model import random_data, random_network


@dataclass
class ShrinkOptions:
    keep: float = 1.0


class Shrink(Defense):
    """Scales the update by `keep` (smaller keeps less)."""

    name = "shrink-one-file"
    Options = ShrinkOptions
    strength = ("keep", -1)  # a smaller keep is the stronger setting

    def transform_update(self, update, ctx):
        return update.map(lambda _, t: t * self.options.keep)

    def two_layer(self, view):
        return view.result(lambda x_: view.plain(x_) * self.options.keep)


@pytest.fixture
def shrink():
    DEFENSES.register(Shrink.name, Shrink)
    try:
        yield Shrink.name
    finally:
        DEFENSES.unregister(Shrink.name)  # the registry as it was for the other tests


def test_a_registered_defense_builds_from_its_spec(shrink):
    chain = make_chain([f"{shrink}:keep=0.5"])
    assert chain.names == [shrink] and chain.defenses[0].options == ShrinkOptions(keep=0.5)
    with pytest.raises(GradleakError, match="has no option 'sigma'"):
        make_chain([f"{shrink}:sigma=1"])


def test_a_registered_defense_climbs_the_guard_ladder(shrink):
    rungs = GuardConfig(ladder=f"{shrink}:keep=0.5;{shrink}:keep=0.1").rungs
    assert [r.text for r in rungs] == [f"{shrink}:keep=0.5", f"{shrink}:keep=0.1"]
    with pytest.raises(GradleakError, match="keep goes from 0.1 to 0.5, a weaker setting"):
        GuardConfig(ladder=[f"{shrink}:keep=0.1", f"{shrink}:keep=0.5"])


def test_a_registered_defense_is_in_the_theory_options(shrink):
    assert shrink in covered_defenses()
    defense = parse_defense(f"{shrink}:keep=0.5")
    assert defense.name == shrink and defense.options == ShrinkOptions(keep=0.5)
    # scaling what the server observes by keep scales the lower bound by 1/keep
    net, (x, y) = random_network(3, 8), random_data(3, 2)
    kept, halved = (lower_bound(net, x, y, 0.1, parse_defense(f"{shrink}:keep={keep}")).lower_numeric
                    for keep in (1, 0.5))
    assert halved == pytest.approx(2 * kept, rel=1e-9)


def test_gone_once_unregistered():
    assert Shrink.name not in DEFENSES and Shrink.name not in covered_defenses()
    with pytest.raises(GradleakError, match="covers the defenses"):
        parse_defense(f"{Shrink.name}:keep=0.5")
