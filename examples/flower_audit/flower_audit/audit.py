"""The one gradleak hook of this app: which model, where each client's
training examples come from (for scoring only; never sent to the server), how the
clients train (the run-config keys of their optimizer, epochs and batch size, and the
rule that seeds each client's shuffling in each round), and what to audit."""
from __future__ import annotations

from flower_audit.task import client_data, held_out_examples, make_model, shuffle_seed
from gradleak.flower import FlowerAudit


def _ground_truth(context, message):
    return client_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]),
                       context.run_config)


# The gallery: MNIST test examples, which no client trains on; a reconstruction that picks out
# its original among them is a re-identification. The attacks are those that apply to clients
# of hundreds of examples: `fedavg` (an honest server replaying the client's local steps) and
# the malicious servers' analytic attacks (loki: bins that stay decodable over the client's local
# steps; scale-mia: bins in the model's own dense layer, disguised to pass the guard's inbound
# checks); each runs under the weakest threat model that allows it.
audit = FlowerAudit(model_fn=make_model, ground_truth=_ground_truth, gallery=held_out_examples,
                    training_keys={"lr": "lr", "momentum": "momentum", "weight_decay": "weight-decay",
                                   "local_epochs": "local-epochs", "local_batch_size": "batch-size"},
                    shuffle_seed_rule=shuffle_seed, rounds=(1, 3), clients=2,
                    threat=("honest", "malicious"),
                    attacks=["fedavg:iterations=125,polish=0.5", "rtf", "loki", "mkor", "scale-mia"])
