"""Every registered attack, through the same interface checks (scikit-learn's check_estimator is
the model): it declares what it needs and a threat model grants it, its options and budgets are
valid and checked, and on a tiny budget on real examples of each modality it declares it returns
a reconstruction of the data's shape and type, the same one for the same seed, without touching
the model the server sent; an observation lacking what it declared is refused in one line.
A newly registered attack is checked by being registered."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from gradleak.api import BUDGETS, _budget_options
from gradleak.attacks import ATTACKS, Reconstruction, make_attack
from gradleak.attacks.base import Attack
from gradleak.data.modality import MODALITIES
from gradleak.errors import GradleakError
from gradleak.knowledge import KNOWLEDGE, PRESETS
from gradleak.options import ComponentSpec, build_options
from gradleak.threat import make_threat_model

from .probes import (
    accepted_models,
    attack_threat,
    fitting_model,
    modality_data,
    observation,
    one_line,
    run_attack,
    tiny_attack,
)

NAMES = ATTACKS.names()
PAIRS = [(name, modality) for name in NAMES for modality in ATTACKS.get(name).modalities]
# Runs of more than a few seconds on one thread at the tiny budget: the learned inverter trains
# its network (one epoch on 256 auxiliary examples) before it reconstructs.
SLOW = {("learned", "image")}
# class fishing says so when the batch holds no example of its target class, as these two do not
pytestmark = pytest.mark.filterwarnings("ignore:.*nothing reconstructed. no example of target_class:UserWarning")



@pytest.mark.parametrize("name", NAMES)
def test_declarations(name):
    cls = ATTACKS.get(name)
    assert issubclass(cls, Attack) and cls.name == name
    assert ATTACKS.summary(name), "no one-line summary for `gradleak list attacks`"
    attack = make_attack(name)
    assert cls.requires <= set(KNOWLEDGE) and cls.uses <= set(KNOWLEDGE)
    assert attack.needs() <= set(KNOWLEDGE)
    assert attack.malicious == ("malicious_model" in attack.needs())
    assert cls.modalities and set(cls.modalities) <= set(MODALITIES)
    # some preset grants what it needs (with declared knowledge added on the command line)
    preset = "malicious" if attack.malicious else "honest"
    extra = sorted(attack.needs() - PRESETS[preset])
    assert make_threat_model(preset, extra).refuses(attack.needs()) is None
    if extra:
        assert make_threat_model(preset).refuses(attack.needs()) is not None


@pytest.mark.parametrize("name", NAMES)
def test_options_budgets_and_presets_are_valid(name):
    cls = ATTACKS.get(name)
    assert set(cls.budgets) <= set(BUDGETS) - {"standard"}  # "standard" is the attack's own defaults
    for where, overrides in [*(("budget " + b, o) for b, o in cls.budgets.items()),
                             *(("preset " + p, o) for p, o in cls.presets.items())]:
        options = build_options(cls.Options, dict(overrides), f"attack '{name}' {where}")
        assert all(getattr(options, k.replace("-", "_")) is not None for k in overrides), where
    budget = cls(build_options(cls.Options, {}, name)).budget()
    assert budget is None or budget >= 1
    # each budget as `gradleak.audit(budget=...)` reads it: quick costs less than the attack's own
    # defaults ("standard"), thorough no less
    budgets = {b: make_attack(ComponentSpec(name, _budget_options(name, b))).budget() for b in BUDGETS}
    if budget is not None:
        assert budgets["quick"] <= budget <= budgets["thorough"] and budgets["standard"] == budget
        assert "quick" not in cls.budgets or budgets["quick"] < budget
    assert budget is not None or not cls.iterative, "an iterative attack has an iteration budget"
    with pytest.raises(GradleakError) as refused:
        make_attack(f"{name}:no_such_option=1")
    assert "no_such_option" in one_line(refused)


@pytest.mark.parametrize("name", NAMES)
def test_fits_a_built_in_model_of_every_modality_it_declares(name):
    attack = tiny_attack(name)
    for modality in attack.modalities:
        assert fitting_model(attack, modality) is not None, (
            f"no small built-in {modality} model fits '{name}' (tests/contracts/probes.py MODEL_CANDIDATES)")


def _params(name, modality):
    marks = [pytest.mark.slow] if (name, modality) in SLOW else []
    return pytest.param(name, modality, marks=marks, id=f"{name}-{modality}")


def _check_reconstruction(rec, modality: str) -> None:
    kind, data = MODALITIES[modality], modality_data(modality)
    assert isinstance(rec, Reconstruction)
    assert isinstance(rec.inputs, torch.Tensor) and rec.inputs.dim() == 1 + len(data.input_shape)
    assert tuple(rec.inputs.shape[1:]) == data.input_shape
    assert rec.inputs.dtype == kind.input_dtype
    if not kind.input_dtype.is_floating_point:
        assert (rec.inputs >= 0).all()
    if rec.labels is not None:  # the batch's recovered labels, scored as a multiset (not row by row)
        assert rec.labels.dim() == 1 and not rec.labels.dtype.is_floating_point
        assert ((rec.labels >= 0) & (rec.labels < data.num_classes)).all()
    assert isinstance(rec.iterations, int) and rec.iterations >= 0
    assert len(rec.trace) == len(rec.trace_iterations)


@pytest.mark.parametrize("name, modality", [_params(n, m) for n, m in PAIRS])
def test_reconstructs_the_datas_shape_and_type_the_same_for_the_same_seed(name, modality):
    """On every candidate model its `unsupported` accepts (the check `attacks="auto"` and sweeps
    choose by), the attack reconstructs or refuses in one line once it sees the update (a
    refusal that needs the update, as tensor's scale on a head of unequal rows), and it
    reconstructs on at least one; there its output is finite and repeats for the same seed."""
    runs, refusals = {}, {}
    for model in accepted_models(tiny_attack(name), modality):
        try:
            run = run_attack(name, model, modality, seed=3)
        except GradleakError as exc:
            refusals[model] = one_line(exc)
            continue
        _check_reconstruction(run.reconstruction, modality)
        # the model the server sent is left as it was (attacks work on copies)
        assert run.sent_model_after.keys() == run.sent_model_before.keys()
        for key, before in run.sent_model_before.items():
            assert torch.equal(run.sent_model_after[key], before), f"{model}: the attack changed the sent {key}"
        runs[model] = run
    assert runs, f"refused on every model it accepts: {refusals}"
    model, first = next(iter(runs.items()))
    rec = first.reconstruction
    if rec.inputs.dtype.is_floating_point:  # scoring counts non-finite rows as not reconstructed
        assert torch.isfinite(rec.inputs).all(), model
    again = run_attack(name, model, modality, seed=3).reconstruction
    assert torch.equal(again.inputs, rec.inputs), "not the same reconstruction for the same seed"
    assert (again.labels is None) == (rec.labels is None)
    if rec.labels is not None:
        assert torch.equal(again.labels, rec.labels)


@pytest.mark.parametrize("name", NAMES)
def test_an_observation_lacking_what_it_declared_is_refused_inone_line(name):
    attack = tiny_attack(name)
    modality = attack.modalities[0]
    model = fitting_model(attack, modality)
    for key in sorted(attack.needs()):
        threat = attack_threat(attack, without=key)
        with pytest.raises(GradleakError) as refused_before:
            threat.check(name, attack.needs())
        assert key in one_line(refused_before)
        if key == "malicious_model":
            # what a malicious server knows is the model it crafted, which the observation carries
            # whatever the grant: the threat model's refusal above, before prepare_model, is the gate
            continue
        obs, ctx = observation(attack, model, modality, threat)
        with pytest.raises(GradleakError) as refused:
            attack.reconstruct(obs, ctx)
        one_line(refused)


def test_every_attack_is_checked():
    """The parameter lists above come from the registry: an attack registered at run time (a
    plugin) is in them too."""
    assert set(NAMES) == set(ATTACKS.names()) and len(NAMES) >= 19
    assert {m for _, m in PAIRS} == set(MODALITIES)
    assert all(dataclasses.is_dataclass(ATTACKS.get(n).Options) for n in NAMES if ATTACKS.get(n).Options)
