"""One list of the client's training fields (gradleak.fl.training's TrainingSpec): the scenario
spec, `gradleak.audit`'s keywords and the Flower hook name no field it lacks, under its one
scenario name, with its own default."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from gradleak.api import audit
from gradleak.fl.training import SCENARIO_NAMES, TrainingSpec, training_field_names, training_field_types
from gradleak.run.experiment import AttackRunSpec

DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainingSpec)}


def test_the_scenario_spec_declares_every_training_field_with_its_default():
    declared = {f.name: f.default for f in dataclasses.fields(AttackRunSpec)}
    for name in training_field_names():
        scenario_name = SCENARIO_NAMES.get(name, name)
        assert scenario_name in declared, f"AttackRunSpec lacks the training field {name} ({scenario_name})"
        assert declared[scenario_name] == DEFAULTS[name], name


def test_audit_keywords_are_training_fields_with_their_defaults():
    scenario = {SCENARIO_NAMES.get(n, n): n for n in training_field_names()}
    keywords = inspect.signature(audit).parameters
    named = [k for k in keywords if k in scenario]
    assert {"lr", "local_steps", "bn_mode", "optimizer", "shuffle_seed", "sends_buffers"} <= set(named)
    for keyword in named:
        assert keywords[keyword].default == DEFAULTS[scenario[keyword]], keyword


def test_the_flower_hook_reads_training_fields_by_their_types():
    pytest.importorskip("flwr")
    from gradleak.flower.hook import TRAINING_FIELDS

    assert set(TRAINING_FIELDS) < set(training_field_names())
    types = training_field_types()
    assert types["lr"] is float and types["local_epochs"] is int and types["shuffle"] is str
    assert types["augment"] is tuple and types["sends_buffers"] is bool


def test_the_command_line_has_a_flag_for_every_training_field_with_its_default():
    import argparse

    from gradleak.commands.attack import add_scenario_arguments, training_from_args

    parser = argparse.ArgumentParser()
    add_scenario_arguments(parser)
    flags = {a.dest: a.default for a in parser._actions}
    for name in training_field_names():
        scenario_name = SCENARIO_NAMES.get(name, name)
        assert scenario_name in flags, f"gradleak attack has no flag for the training field {name}"
        assert flags[scenario_name] == DEFAULTS[name], name
    args = parser.parse_args(["--dataset", "mnist", "--model", "lenet", "--local-epochs", "2", "--lora", "4",
                              "--bn-mode", "eval", "--augment", "flip"])
    training = training_from_args(args)
    assert training == TrainingSpec(local_epochs=2, lora_rank=4, batchnorm="eval", augment=("flip",))
