"""The one gradleak hook of this app: which model, where each client's
training examples come from (for scoring only; never sent to the server), and
which run-config keys tell the server how clients train."""
from __future__ import annotations

from gradleak.flower import FlowerAudit

from flower_audit.task import Net, client_data


def _ground_truth(context, message):
    return client_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]),
                       context.run_config)


audit = FlowerAudit(model_fn=Net, ground_truth=_ground_truth,
                    training_keys={"lr": "lr", "local_epochs": "local-epochs", "local_batch_size": "batch-size"})
