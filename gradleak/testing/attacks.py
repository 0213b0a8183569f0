"""The attack contract (scikit-learn's check_estimator is the model): an attack declares what it
needs and a threat model grants it, its options and budgets are valid and checked, and on a tiny
budget on real examples of each modality it declares it returns a reconstruction of the data's
shape and type, the same one for the same seed, without touching the model the server sent; an
observation lacking what it declared is refused in one line."""
from __future__ import annotations

import dataclasses

import torch

from ..api import BUDGETS, budget_options
from ..attacks import ATTACKS, Reconstruction, make_attack
from ..attacks.base import Attack
from ..errors import GradleakError
from ..knowledge import KNOWLEDGE, PRESETS
from ..modalities import MODALITIES
from ..options import ComponentSpec, build_options
from ..threat import make_threat_model
from .probes import (
    accepted_models,
    attack_threat,
    fitting_model,
    modality_data,
    observation,
    one_line,
    refused,
    require,
    run_attack,
    tiny_attack,
)


def check_attack(name: str) -> None:
    """Every part of the contract for the registered attack `name`, on each modality it
    declares; raises ContractError (an AssertionError) naming the part that fails."""
    check_attack_declarations(name)
    check_attack_options(name)
    check_attack_fits_a_built_in_model(name)
    for modality in ATTACKS.get(name).modalities:
        check_attack_reconstructs(name, modality)
    check_attack_refuses_what_it_was_not_granted(name)


def check_attack_declarations(name: str) -> None:
    cls = ATTACKS.get(name)
    require(isinstance(cls, type) and issubclass(cls, Attack) and cls.name == name,
            f"'{name}' is not an Attack subclass whose name is its registry key")
    require(ATTACKS.summary(name), "no one-line summary for `gradleak list attacks`")
    attack = make_attack(name)
    require(cls.requires <= set(KNOWLEDGE) and cls.uses <= set(KNOWLEDGE) and attack.needs() <= set(KNOWLEDGE),
            f"declares knowledge gradleak does not know: {sorted(attack.needs() - set(KNOWLEDGE))}")
    require(attack.malicious == ("malicious_model" in attack.needs()),
            "malicious exactly when it needs malicious_model")
    require(cls.modalities and set(cls.modalities) <= set(MODALITIES), f"unknown modalities {cls.modalities}")
    # some preset grants what it needs (with declared knowledge added on the command line)
    preset = "malicious" if attack.malicious else "honest"
    extra = sorted(attack.needs() - PRESETS[preset])
    require(make_threat_model(preset, extra).refuses(attack.needs()) is None,
            f"the {preset} preset with {extra} still refuses it")
    if extra:
        require(make_threat_model(preset).refuses(attack.needs()) is not None,
                f"the {preset} preset grants {extra} without being asked")


def check_attack_options(name: str) -> None:
    cls = ATTACKS.get(name)
    require(set(cls.budgets) <= set(BUDGETS) - {"standard"},  # "standard" is the attack's own defaults
            f"budgets {sorted(cls.budgets)} beyond {sorted(set(BUDGETS) - {'standard'})}")
    for where, overrides in [*(("budget " + b, o) for b, o in cls.budgets.items()),
                             *(("preset " + p, o) for p, o in cls.presets.items())]:
        options = build_options(cls.Options, dict(overrides), f"attack '{name}' {where}")
        require(all(getattr(options, k.replace("-", "_")) is not None for k in overrides), where)
    budget = cls(build_options(cls.Options, {}, name)).budget()
    require(budget is None or budget >= 1, f"budget {budget}")
    # each budget as `gradleak.audit(budget=...)` reads it: quick costs less than the attack's own
    # defaults ("standard"), thorough no less
    budgets = {b: make_attack(ComponentSpec(name, budget_options(name, b))).budget() for b in BUDGETS}
    if budget is not None:
        require(budgets["quick"] <= budget <= budgets["thorough"] and budgets["standard"] == budget,
                f"budgets out of order: {budgets}")
        require("quick" not in cls.budgets or budgets["quick"] < budget, "quick costs no less than standard")
    require(budget is not None or not cls.iterative, "an iterative attack has an iteration budget")
    require("no_such_option" in refused(make_attack, f"{name}:no_such_option=1"),
            "an unknown option is refused without naming it")
    if cls.Options is not None:
        require(dataclasses.is_dataclass(cls.Options), "Options is not a dataclass")


def check_attack_fits_a_built_in_model(name: str) -> None:
    attack = tiny_attack(name)
    for modality in attack.modalities:
        require(fitting_model(attack, modality) is not None,
                f"no small built-in {modality} model fits '{name}' (gradleak/testing/probes.py MODEL_CANDIDATES)")


def check_reconstruction(rec: Reconstruction, modality: str) -> None:
    """A reconstruction of `modality`'s contract data: its shape, dtype, labels and trace."""
    kind, data = MODALITIES.get(modality), modality_data(modality)
    require(isinstance(rec, Reconstruction), f"reconstruct returned {type(rec).__name__}")
    require(isinstance(rec.inputs, torch.Tensor) and rec.inputs.dim() == 1 + len(data.input_shape)
            and tuple(rec.inputs.shape[1:]) == data.input_shape,
            f"inputs of shape {tuple(getattr(rec.inputs, 'shape', ()))}, not (N, {data.input_shape})")
    require(rec.inputs.dtype == kind.input_dtype, f"inputs of dtype {rec.inputs.dtype}, not {kind.input_dtype}")
    if not kind.input_dtype.is_floating_point:
        require((rec.inputs >= 0).all(), "negative token ids")
    if rec.labels is not None:  # the batch's recovered labels, scored as a multiset (not row by row)
        require(rec.labels.dim() == 1 and not rec.labels.dtype.is_floating_point, "labels not a 1-d integer tensor")
        require(((rec.labels >= 0) & (rec.labels < data.num_classes)).all(), "labels outside the classes")
    require(isinstance(rec.iterations, int) and rec.iterations >= 0, f"iterations {rec.iterations!r}")
    require(len(rec.trace) == len(rec.trace_iterations), "trace and trace_iterations differ in length")


def check_attack_reconstructs(name: str, modality: str) -> None:
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
        check_reconstruction(run.reconstruction, modality)
        # the model the server sent is left as it was (attacks work on copies)
        require(run.sent_model_after.keys() == run.sent_model_before.keys(), f"{model}: the attack changed the state")
        for key, before in run.sent_model_before.items():
            require(torch.equal(run.sent_model_after[key], before), f"{model}: the attack changed the sent {key}")
        runs[model] = run
    require(runs, f"refused on every model it accepts: {refusals}")
    model, first = next(iter(runs.items()))
    rec = first.reconstruction
    if rec.inputs.dtype.is_floating_point:  # scoring counts non-finite rows as not reconstructed
        require(torch.isfinite(rec.inputs).all(), f"{model}: non-finite inputs")
    again = run_attack(name, model, modality, seed=3).reconstruction
    require(torch.equal(again.inputs, rec.inputs), "not the same reconstruction for the same seed")
    require((again.labels is None) == (rec.labels is None)
            and (rec.labels is None or torch.equal(again.labels, rec.labels)), "not the same labels for the same seed")


def check_attack_refuses_what_it_was_not_granted(name: str) -> None:
    attack = tiny_attack(name)
    modality = attack.modalities[0]
    model = fitting_model(attack, modality)
    for key in sorted(attack.needs()):
        threat = attack_threat(attack, without=key)
        require(key in refused(threat.check, name, attack.needs()), f"the refusal without {key} does not name it")
        if key == "malicious_model":
            # what a malicious server knows is the model it crafted, which the observation carries
            # whatever the grant: the threat model's refusal above, before prepare_model, is the gate
            continue
        obs, ctx = observation(attack, model, modality, threat)
        refused(attack.reconstruct, obs, ctx)
