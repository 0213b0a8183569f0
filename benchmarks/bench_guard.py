"""The client-side guard (gradleak.guard, gradleak.flower.guard) on the example apps.

- inbound: models crafted by gradleak's rtf, fishing and mkor `prepare_model`, one per round
  of an honest FedAvg trajectory (the crafted model replaces that round's global model; the
  client compares it with the previous round's and its own last update; round 1 has nothing
  to compare with), and the false alarms over 20 honest rounds of each example app, for every
  client. The trajectories are simulated with gradleak's own client (gradleak.fl) on the
  example's model, data and training, not by running Flower for 20 rounds.
- outbound (examples/flower_audit's setting): a federation in which every client runs the
  guard each round, against the same federation under fixed noise of the strength the guard
  ended on and without any defense: the rung per round, the verdict after it, the guard's
  seconds against the client's training seconds, and the final accuracy (MNIST test split).
- flower: the example's real ClientApp (examples/flower_audit, all its mods) driven
  in-process with Flower messages, `guard = true`: an honest round 1, an rtf-crafted model in
  round 2, an honest round 3.

`--quick`: fewer rounds and clients everywhere.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MNIST = (1, 28, 28)
IMAGE_ATTACKS = ("rtf", "rtf:bins=16,query=gaussian", "fishing", "fishing:target_class=3,fish_bias=5")
MKOR_ATTACKS = ("mkor", "mkor:noise=0.01", "mkor:noise=0.1,shuffle=false")
MNIST_CONFIG = {"seed": 0, "dirichlet-alpha": 0.5, "examples-per-client": 8}
TEXT_CONFIG = {"seed": 0, "seq-len": 16, "sequences-per-client": 4}


def _apps_on_path() -> None:
    for app in ("flower_audit", "flower_text"):
        if str(EXAMPLES / app) not in sys.path:
            sys.path.insert(0, str(EXAMPLES / app))


def _mnist_setting(clients: int):
    from flower_audit.task import client_data, shuffle_seed

    from gradleak.fl import TrainingSpec

    data = [client_data(i, 10, MNIST_CONFIG) for i in range(clients)]

    def training(r, c):
        return TrainingSpec(lr=0.05, optimizer="sgd:momentum=0.9,weight_decay=0.0005", local_epochs=2,
                            local_batch_size=32, shuffle_seed=shuffle_seed(MNIST_CONFIG, r, c))
    return data, training


def _load(factory, state):
    model = factory()
    model.load_state_dict(state)
    return model


def inbound(quick: bool) -> dict:
    from flower_audit.task import initial_model

    from gradleak.attacks import make_attack
    from gradleak.attacks.base import AttackContext
    from gradleak.guard import Guard, GuardConfig, check_received
    from gradleak.guard.trajectory import honest_fedavg
    from gradleak.models import ModelSpec, build_model

    rounds, clients = (4, 4) if quick else (20, 10)
    data, training = _mnist_setting(clients)
    out: dict = {"rounds": rounds, "clients": clients}

    def lenet5():
        return build_model(ModelSpec("lenet5", MNIST, 10, seed=0))

    def net():
        return initial_model(0)
    for label, factory, attacks in (("cnn (flower_audit's Net)", net, IMAGE_ATTACKS), ("lenet5", lenet5, MKOR_ATTACKS)):
        history = list(honest_fedavg(factory(), data, training, rounds))
        false_alarms, checked = [], 0
        for client in range(clients):
            g = Guard(GuardConfig(), training=training(1, client))
            for now in history:
                report = g.inbound(now.received, now.number)
                checked += 1
                if report.crafted:
                    false_alarms.append(f"round {now.number} client {client}: {report.summary()}")
                g.own_change = now.updates[client].tensors
        out[f"honest {label}"] = {"client_rounds": checked, "false_alarms": len(false_alarms),
                                  "examples": false_alarms[:3]}
        for spec in attacks:
            attack, detected, alone, checks, seconds = make_attack(spec), 0, 0, {}, []
            for now in history:
                crafted = attack.prepare_model(_load(factory, now.received), MNIST, 10,
                                               AttackContext(seed=now.number)).model
                before = history[now.number - 2] if now.number > 1 else None
                report = check_received(crafted, before.received if before else None,
                                        before.updates[0].tensors if before else None)
                detected += report.crafted
                alone += check_received(crafted).crafted
                seconds.append(report.seconds)
                for c in report.checks:
                    checks[c] = checks.get(c, 0) + 1
            out[f"{spec} on {label}"] = {"rounds": len(history), "detected": detected,
                                         "detected_without_previous_model": alone, "checks_fired": checks,
                                         "median_check_seconds": round(statistics.median(seconds), 4)}
    out["honest text (flower_text's GPT-2)"] = _text_false_alarms(4 if quick else 20, 3 if quick else 8)
    return out


def _text_false_alarms(rounds: int, clients: int) -> dict:
    from flower_text.task import Net, client_data

    from gradleak.fl import TrainingSpec
    from gradleak.guard import Guard, GuardConfig
    from gradleak.guard.trajectory import honest_fedavg

    data = [client_data(i, 8, TEXT_CONFIG) for i in range(clients)]
    training = TrainingSpec(lr=0.01, local_epochs=1, local_batch_size=8)
    guards = {c: Guard(GuardConfig(), training=training) for c in range(clients)}
    alarms, seconds = [], []
    for now in honest_fedavg(Net(0), data, lambda r, c: training, rounds):
        for client, g in guards.items():
            report = g.inbound(now.received, now.number)
            seconds.append(report.seconds)
            if report.crafted:
                alarms.append(f"round {now.number} client {client}: {report.summary()}")
            g.own_change = now.updates[client].tensors
    return {"client_rounds": len(seconds), "false_alarms": len(alarms), "examples": alarms[:3],
            "median_check_seconds": round(statistics.median(seconds), 3)}


def outbound(quick: bool, model: str = "example") -> dict:
    """`model` "example": the app's sigmoid CNN, every round; "mlp": gradleak's mlp on the same
    clients and training (the example's CNN does not learn within tens of rounds of this
    setting, so its accuracy cannot show a defense's cost), audited every 5th round."""
    from flower_audit.task import evaluate, initial_model

    from gradleak.data import DatasetSpec, load_dataset
    from gradleak.defenses import make_chain
    from gradleak.fl import compute_update
    from gradleak.fl.places import DefenseContext
    from gradleak.guard import Guard, GuardConfig
    from gradleak.guard.trajectory import honest_fedavg
    from gradleak.models import ModelSpec, build_model
    from gradleak.seeding import stream

    rounds, clients = (2, 3) if quick else ((5, 10) if model == "example" else (20, 10))
    every = 1 if model == "example" else 5
    data, training = _mnist_setting(clients)
    galleries = [_other_examples(c) for c in range(clients)]
    test = load_dataset(DatasetSpec("mnist", split="test"))
    config = GuardConfig(strongest=("ig:iterations=200",), start="last", every=every)
    def factory(seed: int):
        return initial_model(seed) if model == "example" else build_model(ModelSpec(model, MNIST, 10, seed=seed))
    guards = [Guard(config, training=training(1, c), client=c) for c in range(clients)]
    per_round: dict[int, list] = {}
    train_seconds: list[float] = []

    def guarded(number, client, model, update, x, y):
        start = time.perf_counter()
        compute_update(model, x, y, training(number, client))  # the client's own training, timed
        train_seconds.append(time.perf_counter() - start)
        decision = guards[client].outbound(model, update, (x, y), gallery=galleries[client], server_round=number,
                                           training=training(number, client))
        first = decision.audits[0] if decision.audits else None
        per_round.setdefault(number, []).append({
            "client": client, "rung": decision.rung_text, "grade": decision.grade, "sent": decision.send,
            "seconds": round(decision.seconds, 2), "verdict": decision.reason,
            "first_audit": {"rung": decision.rung - len(decision.audits) + 1, "leaks": first.leaks} if first else None})
        return decision.update

    final = list(honest_fedavg(factory(0), data, training, rounds, keep=(), send=guarded, final=True))[-1]
    out = {"setting": f"{clients} clients of examples/flower_audit ({model} model), {rounds} rounds, guard every "
                      f"{every} round(s) "
                      f"(tolerance 0, ladder {'; '.join(r.text for r in config.rungs)}, {config.strongest[0]}, "
                      "start at the last rung, gallery: 64 other examples of the client's share)",
           "rounds": {}}
    for number, rows in per_round.items():
        out["rounds"][number] = {
            "rungs": _count(r["rung"] for r in rows), "grades": _count(r["grade"] for r in rows),
            "guard_seconds_median": statistics.median(r["seconds"] for r in rows),
            "clients": rows}
    unprotected = [r for rows in per_round.values() for r in rows
                   if r["sent"] and r["rung"] == "none" and r["grade"] == "leaks"]
    graded_leaking = [r for rows in per_round.values() for r in rows
                      if r["first_audit"] and r["first_audit"]["rung"] == 0 and r["first_audit"]["leaks"]]
    guard_seconds = [r["seconds"] for rows in per_round.values() for r in rows]
    top = max(guards, key=lambda g: g.rung)
    strength = top.config.rungs[top.rung - 1].text if top.rung else None
    accuracy = {"guarded": _accuracy(final.received, test, evaluate, factory)}
    for label, rung in (("fixed " + (strength or "none"), strength), ("no defense", None)):
        def fixed(number, client, model, update, x, y, rung=rung):
            if rung is None:
                return update
            ctx = DefenseContext(stream(0, "fixed", number, client), {}, training(number, client), model)
            return make_chain([rung]).transform_update(update, ctx)
        last = list(honest_fedavg(factory(0), data, training, rounds, keep=(), send=fixed, final=True))[-1]
        accuracy[label] = _accuracy(last.received, test, evaluate, factory)
    out.update({"undefended_graded_leaking": len(graded_leaking), "sent_unprotected_while_leaking": len(unprotected),
                "guard_seconds_per_client_round_median": statistics.median(guard_seconds),
                "client_training_seconds_median": round(statistics.median(train_seconds), 4),
                "final_strength": strength, "test_loss_and_accuracy_1000": accuracy})
    return out


def _other_examples(partition: int):
    from types import SimpleNamespace

    from flower_audit.guard import other_examples

    return other_examples(SimpleNamespace(run_config=MNIST_CONFIG, node_config={
        "partition-id": partition, "num-partitions": 10}))


def _accuracy(state, test, evaluate, factory) -> list[float]:
    loss, accuracy = evaluate(_load(lambda: factory(0), state), test.inputs[:1000], test.labels[:1000])
    return [round(loss, 4), round(accuracy, 4)]


def _count(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def flower_app(quick: bool) -> dict:
    """The example's ClientApp with guard = true, a malicious round 2 (Robbing the Fed)."""
    import os
    import tempfile
    import tomllib

    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from gradleak.attacks import make_attack
    from gradleak.attacks.base import AttackContext

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    tmp = tempfile.mkdtemp()
    os.environ["GRADLEAK_FLOWER_OUT"], os.environ["GRADLEAK_GUARD_LOG"] = tmp, f"{tmp}/guard.jsonl"
    from flower_audit.client_app import app
    from flower_audit.task import Net, initial_model

    config = tomllib.loads((EXAMPLES / "flower_audit" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    config.update({"guard": True, "guard-attacks": "ig:iterations=100", "guard-start": "last"})
    clients = 3 if quick else 10
    contexts = [Context(run_id=1, node_id=100 + c, node_config={"partition-id": c, "num-partitions": 10},
                        state=RecordDict(), run_config=config) for c in range(clients)]
    global_state = initial_model(0).state_dict()
    out: dict = {}
    for number in (1, 2, 3):
        sent = global_state
        if number == 2:
            crafted = make_attack("rtf").prepare_model(_load(Net, global_state), MNIST, 10,
                                                       AttackContext(seed=2)).model
            sent = {k: v.detach() for k, v in crafted.state_dict().items()}
        replies = []
        for context in contexts:
            msg = Message(RecordDict({"arrays": ArrayRecord(sent), "config": ConfigRecord({
                "server-round": number, "lr": float(config["lr"])})}), dst_node_id=context.node_id,
                message_type="train")
            replies.append(app(msg, context))
        good = [r for r in replies if not r.has_error()]
        out[f"round {number}" + (" (rtf-crafted model)" if number == 2 else "")] = {
            "replies": len(replies), "refused_or_withheld": len(replies) - len(good),
            "reasons": sorted({r.error.reason[:160] for r in replies if r.has_error()})[:2],
            "rungs": _count(int(r.content["metrics"]["guard-rung"]) for r in good)}
        if good:  # FedAvg of the returned models
            states = [{k: torch.as_tensor(v) for k, v in r.content["arrays"].to_torch_state_dict().items()}
                      for r in good]
            global_state = {k: sum(s[k] for s in states) / len(states) for k in states[0]}
    return out


def run(quick: bool = False) -> dict:
    torch.set_num_threads(1)
    _apps_on_path()
    start = time.perf_counter()
    out = {"inbound": inbound(quick)}
    out["inbound_seconds"] = round(time.perf_counter() - start, 1)
    out["flower_app"] = flower_app(quick)
    out["outbound"] = outbound(quick)
    out["outbound_utility_mlp"] = outbound(quick, "mlp")
    return out
