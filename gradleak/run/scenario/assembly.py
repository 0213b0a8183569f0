"""A scenario assembled from its names: the dataset and model a spec names, the checks made
before anything is computed, and the train split a model is pre-trained on."""
from __future__ import annotations

from typing import Callable

from torch import nn

from ...attacks import Attack, make_attack
from ...attacks.base import check_fits
from ...data import Dataset, DatasetSpec, load_dataset
from ...data.base import DataSignature
from ...data.references import dataset_spec
from ...defenses import DefenseChain, make_chain
from ...errors import GradleakError
from ...models.references import build_reference, parse_model_reference
from ...threat import ThreatModel, expected_view, make_threat_model
from .spec import AttackRunSpec


def build_scenario_model(spec: AttackRunSpec, signature: DataSignature):
    return build_reference(parse_model_reference(spec.model), signature, spec.seed, spec.activation)


def scenario_data(spec: AttackRunSpec, load: Callable[[DatasetSpec], Dataset] = load_dataset) -> Dataset:
    return load(dataset_spec(spec.dataset, spec.split, spec.resize, spec.seq_len))


def scenario_model(spec: AttackRunSpec, data: Dataset) -> nn.Module:
    """The attacked model as `run_attack` builds it, with its checkpoint (before pre-training)."""
    model = build_scenario_model(spec, data.signature)
    if spec.checkpoint:
        from ...models.checkpoint import load_checkpoint
        load_checkpoint(model, spec.checkpoint)
    return model


def check_scenario(spec: AttackRunSpec, data: Dataset, model: nn.Module | None = None
                   ) -> tuple[Attack, DefenseChain, ThreatModel]:
    """The checks `run_scenario` makes before anything is computed: the attack, the defense
    chain and the threat model build, the attack fits the threat model, the data's modality
    and (given `model`) the architecture (`attacks.base.refusal`, the one check attack
    selection makes too; `AttackRefused` otherwise), and the data holds enough examples.
    Returns (attack, chain, threat model)."""
    attack_spec = spec.attack_spec
    attack = make_attack(attack_spec)
    chain = make_chain(spec.defense_specs)
    # what the update will carry (batch-norm statistics in sent buffers) counts as seen
    threat = expected_view(make_threat_model(spec.threat, spec.knows), spec.training(), spec.batch_size,
                           chain.aggregate_clients)
    check_fits(attack_spec.name, attack, threat, data.modality, model, data.input_shape, data.num_classes)
    if spec.lora is not None and not getattr(attack, "handles_lora", False):
        raise GradleakError(f"attack '{attack_spec.name}' cannot invert a LoRA client's update (--lora): it "
                            "holds only the adapters' tensors; use dager")
    check_whole_batches(spec.images, spec.batch_size)
    check_enough_examples(len(data), data.name, spec.images, spec.batch_size, chain.aggregate_clients)
    return attack, chain, threat


def check_enough_examples(examples: int, name: str, images: int | None, batch_size: int, clients: int) -> None:
    """Dataset `name`'s `examples` hold the attacked ones (`images`, default one batch) and a
    batch for each of the other `clients` − 1 that secure aggregation sums with the attacked one."""
    needed = (images or batch_size) + (clients - 1) * batch_size
    if needed > examples:
        raise GradleakError(f"dataset '{name}' has {examples} examples, the scenario needs {needed}")


def check_whole_batches(images: int | None, batch_size: int) -> None:
    """Every attacked client holds one batch of `batch_size`: a last, smaller batch would be a
    smaller client (easier to invert) judged as one of `batch_size`, so `images` must be whole
    batches."""
    sizes = (images, batch_size)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        return  # not numbers of examples: the spec's own range checks say so
    if images % batch_size:
        whole = [n for n in (images // batch_size * batch_size, (images // batch_size + 1) * batch_size) if n]
        raise GradleakError(f"--images {images} is not a whole number of batches of {batch_size}: each attacked "
                            f"client holds one batch of {batch_size}, and a smaller last batch would be judged as "
                            f"one; use {' or '.join(map(str, whole))}")


def validate_run_spec(spec: AttackRunSpec, load: Callable[[DatasetSpec], Dataset], built: set) -> None:
    """Every check `run_attack` makes before it attacks — the dataset reference and its
    options, the model reference with its options, activation and checkpoint, a train split
    to pre-train on, and `check_scenario` — without running anything. `load` reads datasets
    (a caching loader serves a whole sweep); `built` holds the models already built."""
    data = scenario_data(spec, load)
    model_key = (spec.model, spec.activation, spec.checkpoint, spec.dataset, spec.split, spec.resize, spec.seq_len)
    if model_key not in built:
        scenario_model(spec, data)  # builds it: its options, activation and checkpoint are checked
        built.add(model_key)
    if spec.pretrain_steps:
        pretraining_data(spec, load)
    check_scenario(spec, data)


def pretraining_data(spec: AttackRunSpec, load: Callable[[DatasetSpec], Dataset] = load_dataset) -> Dataset:
    """The train split `--pretrain-steps` trains on; refused for a set of sample images."""
    train = load(dataset_spec(spec.dataset, "train", spec.resize, spec.seq_len))
    if train.samples_only:
        raise GradleakError(f"dataset '{train.name}' ships only sample images; it cannot pre-train a model "
                            "(use --checkpoint, or pre-train on mnist/fashion-mnist)")
    return train


def pretrained(model, spec: AttackRunSpec):
    from ...models.training import pretrain

    pretrain(model, pretraining_data(spec), steps=spec.pretrain_steps, seed=spec.seed)
    return model
