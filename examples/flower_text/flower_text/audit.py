"""The one gradleak hook of this app: the model, where each client's sequences come from
(for scoring only; never sent to the server), how the clients train (the run-config keys of
the learning rate, epochs and batch size) and the held-out sequences that recoveries are
re-identified among."""
from __future__ import annotations

from flower_text.task import Net, client_data, held_out_sequences
from gradleak.data.text import VOCAB_SIZE
from gradleak.flower import FlowerAudit


def _ground_truth(context, message):
    return client_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]),
                       context.run_config)


audit = FlowerAudit(model_fn=Net, ground_truth=_ground_truth, gallery=held_out_sequences, num_classes=VOCAB_SIZE,
                    tokenizer="gpt2",
                    training_keys={"lr": "lr", "local_epochs": "local-epochs", "local_batch_size": "batch-size",
                                   "lora_rank": "lora-rank"})
