"""The ClientApp: train on this client's data, send the new weights."""
from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod

from flower_audit.audit import audit
from flower_audit.guard import guard
from flower_audit.task import client_data, evaluate, make_model, shuffle_seed, train


def local_dp(msg: Message, context: Context, call_next) -> Message:
    """Flower's own local differential privacy (clipping + noise on each update),
    configured by the run config; `local-dp-epsilon = 0` turns it off."""
    epsilon = float(context.run_config["local-dp-epsilon"])
    if epsilon <= 0:
        return call_next(msg, context)
    clip = float(context.run_config["local-dp-clip"])
    return LocalDpMod(clipping_norm=clip, sensitivity=clip, epsilon=epsilon, delta=1e-5)(msg, context, call_next)


# audit.client_mod is gradleak's hook: it records the examples each audited client
# trains on, for scoring, outside Flower's messages.
app = ClientApp(mods=[guard.client_mod, audit.client_mod, local_dp])


def _data(context: Context):
    return client_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]),
                       context.run_config)


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = make_model(context.run_config)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = _data(context)
    server_round = int(msg.content["config"]["server-round"])
    seed = shuffle_seed(context.run_config, server_round, int(context.node_config["partition-id"]))
    loss = train(model, x, y, context.run_config, seed)
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"train_loss": loss, "num-examples": len(x)})})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    model = make_model(context.run_config)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = _data(context)
    loss, accuracy = evaluate(model, x, y)
    content = RecordDict({"metrics": MetricRecord({"eval_loss": loss, "eval_acc": accuracy,
                                                   "num-examples": len(x)})})
    return Message(content=content, reply_to=msg)
