"""gradleak's client-side guard for this app, on with `--run-config guard=true`: before
training, a model crafted to leak is refused; after training, the update is audited against
the client's own examples (re-identified among its other MNIST examples) and sent under the
weakest rung of the noise ladder that passes, or not at all. The model, the examples and the
training are the audit hook's; `guard-*` run-config keys tune it (docs/guard.md)."""
from __future__ import annotations

import torch

from flower_audit.audit import audit
from gradleak.data import DatasetSpec, load_dataset
from gradleak.flower.guard import FlowerGuard
from gradleak.utility import dirichlet_partition

GALLERY = 64  # other examples of the client's own share


def other_examples(context) -> tuple[torch.Tensor, torch.Tensor]:
    """This client's share of MNIST beyond the examples it trains on (as task.client_data
    draws them), up to GALLERY, with their labels (linkage is judged within a class)."""
    config = context.run_config
    partition, partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    train = load_dataset(DatasetSpec("mnist", split="train"))
    seed = int(config["seed"])
    shard = dirichlet_partition(train.labels, partitions, float(config["dirichlet-alpha"]), seed)[partition]
    order = torch.randperm(len(shard), generator=torch.Generator().manual_seed(seed + partition))
    kept = int(config["examples-per-client"])
    others = shard[order[kept:kept + GALLERY]]
    return train.inputs[others], train.labels[others]


guard = FlowerGuard.from_audit(audit, gallery=other_examples)
