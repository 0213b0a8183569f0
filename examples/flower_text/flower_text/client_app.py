"""The ClientApp: train on this client's sequences, send the new weights (or adapters)."""
from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_text.audit import audit
from flower_text.guard import guard
from flower_text.task import client_data, client_model, sent_arrays, train

# audit.client_mod is gradleak's hook: it records the sequences each audited client trains
# on, for scoring, outside Flower's messages.
app = ClientApp(mods=[guard.client_mod, audit.client_mod])


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = client_model(context.run_config)
    arrays = msg.content["arrays"].to_torch_state_dict()
    model.load_state_dict(arrays, strict=len(arrays) == len(model.state_dict()))
    x, y = client_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]),
                       context.run_config)
    loss = train(model, x, y, context.run_config)
    content = RecordDict({"arrays": ArrayRecord(sent_arrays(model)),
                          "metrics": MetricRecord({"train_loss": loss, "num-examples": len(x)})})
    return Message(content=content, reply_to=msg)
