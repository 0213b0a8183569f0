"""The client-side guard (gradleak.guard, gradleak.flower.guard) on the example apps.

- inbound: models crafted by gradleak's rtf, fishing, loki, mkor and scale-mia `prepare_model`, one per
  round of an honest FedAvg trajectory (the crafted model replaces that round's global model;
  the client compares it with the previous round's and its own last update; round 1 has nothing
  to compare with), and the false alarms over 20 honest rounds of each example app, for every
  client; the inbound score (`InboundReport.score`, the largest check margin) as a detector:
  its ROC AUC and detection rate at false-alarm rates 0, 1% and 5% (`detector_roc`), honest
  client-rounds against crafted rounds of the same model; and the median D-SNR (Garov et al.'s
  disaggregation SNR, `gradleak.guard.dsnr`) of the honest and the crafted models on client 0's
  examples. The trajectories are simulated with
  gradleak's own client (gradleak.fl) on the example's model, data and training, not by running
  Flower for 20 rounds.
- outbound (examples/flower_audit's clients at small sizes): a federation in which every
  client runs the guard, against the same federation under fixed noise of the strongest rung
  the guard sent and without any defense: the rung per round, the verdict after it, the
  guard's seconds against the client's training seconds, and the test accuracy (MNIST test
  split). Case "outbound": the sigmoid CNN, where the undefended update leaks; case
  "utility": the example's LeNet-5, which learns within its 10 rounds.
- chance: the leak rule on updates that carry nothing (Gaussian noise at the update's RMS).
- screen: the guard between audits (every 5 rounds, the screen's drift and growth tests in
  between) against the full audit of every round on the utility case's clients: agreement and
  seconds per round. repeat: the full audit against itself (attack seeds 0 and 1).
  screen_example, repeat_example: the same at the example's real partitions (400 examples per
  client, 13 local steps, 20 s per rung); `--seed S` sets the example's seed there.
- top_rung: later rounds' plain, top-rung and content-free updates of the same clients, each
  audited once: whether the top rung stops the attack, and how far one audit's linkage moves.
- flower: the example's real ClientApp (examples/flower_audit, all its mods) driven
  in-process with Flower messages, `guard = true`: an honest round 1, an rtf-crafted model in
  round 2, an honest round 3.

`python -m benchmarks guard` runs every case; `python -m benchmarks guard --cases utility chance`
runs the cases named. `--quick`: fewer rounds and clients everywhere.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks import common
from gradleak.guard.inbound import json_score

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MNIST = (1, 28, 28)
IMAGE_ATTACKS = ("rtf", "rtf:bins=16,query=gaussian", "fishing", "fishing:target_class=3,fish_bias=5", "loki")
MKOR_ATTACKS = ("mkor", "mkor:noise=0.01", "mkor:noise=0.1,shuffle=false")
# bins written into the model's own first dense+ReLU layer: the example's (ReLU) LeNet-5
LATENT_ATTACKS = ("scale-mia", "scale-mia:query=mean")
# the inbound measurements ran on the example's sigmoid CNN (its default model then)
MNIST_CONFIG = {"seed": 0, "dirichlet-alpha": 0.5, "examples-per-client": 8, "model": "sigmoid-cnn"}
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
    from gradleak.fl import TrainingSpec, compute_update
    from gradleak.guard import Guard, GuardConfig, check_received
    from gradleak.guard.bins import binned_pairs
    from gradleak.guard.dsnr import disaggregation_snr
    from gradleak.guard.trajectory import honest_fedavg
    from gradleak.models import ModelSpec, build_model

    rounds, clients = (4, 4) if quick else (20, 10)
    data, training = _mnist_setting(clients)
    out: dict = {"rounds": rounds, "clients": clients}

    def lenet5():
        return build_model(ModelSpec("lenet5", MNIST, 10, seed=0))

    def net():
        return initial_model(MNIST_CONFIG)

    def relu_lenet5():
        return initial_model({**MNIST_CONFIG, "model": "lenet5"})
    for label, factory, attacks in (("cnn (flower_audit's sigmoid-cnn)", net, IMAGE_ATTACKS),
                                    ("lenet5", lenet5, MKOR_ATTACKS),
                                    ("flower_audit's lenet5 (ReLU)", relu_lenet5, LATENT_ATTACKS)):
        history = list(honest_fedavg(factory(), data, training, rounds))
        false_alarms, checked, honest_scores, binned_alarms = [], 0, [], []
        for client in range(clients):
            g = Guard(GuardConfig(), training=training(1, client))
            for now in history:
                report = g.inbound(now.received, now.number)
                checked += 1
                honest_scores.append(report.score)
                if report.crafted:
                    false_alarms.append(f"round {now.number} client {client}: {report.summary()}")
                # the outbound bins check on the update this client sent
                binned = binned_pairs(_load(factory, now.received), now.updates[client], data[client][0])
                if binned:
                    binned_alarms.append(f"round {now.number} client {client}: {binned[0]}")
                g.own_change = now.updates[client].tensors
        x0, y0 = data[0]
        out[f"honest {label}"] = {"client_rounds": checked, "false_alarms": len(false_alarms),
                                  "examples": false_alarms[:3], "bins_false_alarms": len(binned_alarms),
                                  "bins_examples": binned_alarms[:3],
                                  "dsnr_median": round(statistics.median(
                                      disaggregation_snr(_load(factory, now.received), x0, y0) for now in history), 2),
                                  "score_max": json_score(max(honest_scores)),
                                  "score_median": json_score(statistics.median(honest_scores))}
        for spec in attacks:
            attack, detected, alone, checks, seconds, scores, dsnr = make_attack(spec), 0, 0, {}, [], [], []
            bins = {"fedsgd": 0, "local": 0}
            for now in history:
                crafted = attack.prepare_model(_load(factory, now.received), MNIST, 10,
                                               AttackContext(seed=now.number)).model
                before = history[now.number - 2] if now.number > 1 else None
                report = check_received(crafted, before.received if before else None,
                                        before.updates[0].tensors if before else None)
                detected += report.crafted
                scores.append(report.score)
                dsnr.append(disaggregation_snr(crafted, x0, y0))
                # client 0 trains on it (FedSGD and the case's training): the outbound bins check
                for kind, plan in (("fedsgd", TrainingSpec(lr=0.1)), ("local", training(now.number, 0))):
                    bins[kind] += bool(binned_pairs(crafted, compute_update(crafted, x0, y0, plan), x0))
                alone += check_received(crafted).crafted
                seconds.append(report.seconds)
                for c in report.checks:
                    checks[c] = checks.get(c, 0) + 1
            out[f"{spec} on {label}"] = {"rounds": len(history), "detected": detected,
                                         "detected_without_previous_model": alone, "checks_fired": checks,
                                         "median_check_seconds": round(statistics.median(seconds), 4),
                                         "score_min": json_score(min(scores)),
                                         "dsnr_median": json_score(round(statistics.median(dsnr), 2)),
                                         "roc": detector_roc(honest_scores, scores),
                                         "outbound_bins_detected": bins}
    out["honest text (flower_text's GPT-2)"] = _text_false_alarms(4 if quick else 20, 3 if quick else 8)
    return out


# the false-alarm rates at which the detector's ROC is read
FALSE_ALARM_RATES = (0.0, 0.01, 0.05)


def detector_roc(honest: list[float], crafted: list[float]) -> dict:
    """The inbound score as a detector: its ROC AUC (the chance that a crafted model scores
    above an honest one, ties counting half) and, at each false-alarm rate, the detection rate
    with the threshold at which the honest client-rounds alarm at that rate or less."""
    ranked = sorted(honest, reverse=True)
    at_rate = {}
    for rate in FALSE_ALARM_RATES:
        threshold = ranked[min(int(rate * len(ranked)), len(ranked) - 1)]  # honest scores above it: ≤ rate
        at_rate[f"{rate:g}"] = {"threshold": json_score(threshold),
                                "detection": round(sum(c > threshold for c in crafted) / len(crafted), 4)}
    wins = sum((c > h) + 0.5 * (c == h) for c in crafted for h in honest)
    return {"auc": round(wins / (len(crafted) * len(honest)), 4), "at_false_alarm_rate": at_rate}


def _text_false_alarms(rounds: int, clients: int) -> dict:
    from flower_text.task import Net, client_data

    from gradleak.fl import TrainingSpec
    from gradleak.guard import Guard, GuardConfig
    from gradleak.guard.trajectory import honest_fedavg

    data = [client_data(i, 8, TEXT_CONFIG) for i in range(clients)]
    training = TrainingSpec(lr=0.01, local_epochs=1, local_batch_size=8)
    guards = {c: Guard(GuardConfig(), training=training) for c in range(clients)}
    alarms, seconds, scores = [], [], []
    for now in honest_fedavg(Net(0), data, lambda r, c: training, rounds):
        for client, g in guards.items():
            report = g.inbound(now.received, now.number)
            seconds.append(report.seconds)
            scores.append(report.score)
            if report.crafted:
                alarms.append(f"round {now.number} client {client}: {report.summary()}")
            g.own_change = now.updates[client].tensors
    return {"client_rounds": len(seconds), "false_alarms": len(alarms), "examples": alarms[:3],
            "median_check_seconds": round(statistics.median(seconds), 3),
            "score_max": json_score(max(scores)), "score_median": json_score(statistics.median(scores))}


# The outbound cases: examples/flower_audit's clients and training at small sizes, FedAvg
# simulated with gradleak's client. "leak": the sigmoid CNN of the gradient-inversion
# literature, 8 examples, 2 local epochs, every round audited (where the undefended update
# leaks); "utility": the example's LeNet-5 (ReLU, a hidden dense layer), which learns within
# 10 rounds at 10 local full-batch epochs of 8 examples, audited in rounds 1 and 6 with
# Inverting Gradients at 25 iterations (its budget ladder doubles it up to 100): one audit
# takes 10-15 s on a shared 2-core CPU, where 100 iterations (up to 400) took 40-56 s.
OUTBOUND = {
    "leak": {"config": {**MNIST_CONFIG, "model": "sigmoid-cnn"}, "clients": 10, "rounds": 5, "every": 1,
             "local_epochs": 2, "batch_size": 32, "attack": "ig:iterations=200"},
    "utility": {"config": {**MNIST_CONFIG, "model": "lenet5"}, "clients": 3, "rounds": 10, "every": 5,
                "local_epochs": 10, "batch_size": 8, "attack": "ig:iterations=25"},
    # the example at its real partitions (400 examples, one epoch of mini-batches of 32: 13 local
    # steps), the guard's default attack under a 20 s budget per rung (an audit at the
    # example's 60 s decides the same here: Inverting Gradients recovers nothing of 400
    # examples in either)
    "example": {"config": {**MNIST_CONFIG, "model": "lenet5", "examples-per-client": 400}, "clients": 3,
                "rounds": 10, "every": 5, "local_epochs": 1, "batch_size": 32, "attack": "ig:iterations=300",
                "time_budget": 20.0},
}


def _outbound_case(case: str, quick: bool, quick_rounds: int = 2, seed: int | None = None
                   ) -> tuple[dict, dict, int, int]:
    """The outbound case's setting (fewer clients and rounds with `quick`; the app's `seed`, its
    partitions and initial model, when given), its app config, clients and rounds."""
    setting = dict(OUTBOUND[case])
    if seed is not None:
        setting["config"] = {**setting["config"], "seed": seed}
    if quick:
        setting.update(clients=2, rounds=quick_rounds)
    return setting, setting["config"], setting["clients"], setting["rounds"]


def _clients(setting: dict):
    """The setting's clients: their examples, their training per round and their galleries."""
    from flower_audit.task import client_data

    config = setting["config"]
    data = [client_data(i, 10, config) for i in range(setting["clients"])]
    return data, _training(setting), [_other_examples(c, config) for c in range(setting["clients"])]


def _training(setting: dict):
    from flower_audit.task import shuffle_seed

    from gradleak.fl import TrainingSpec

    def training(r, c):
        return TrainingSpec(lr=0.05, optimizer="sgd:momentum=0.9,weight_decay=0.0005",
                            local_epochs=setting["local_epochs"], local_batch_size=setting["batch_size"],
                            shuffle_seed=shuffle_seed(setting["config"], r, c))
    return training


def outbound(quick: bool, case: str = "leak") -> dict:
    """A federation in which every client runs the guard (default tolerance and ladder, start at
    the last rung), against the same federation under fixed noise of the strongest rung the
    guard sent and without any defense: per round the rungs sent, the verdicts after them and
    the guard's seconds; the test accuracy after every round (1,000 MNIST test examples)."""
    from flower_audit.task import evaluate, make_model

    from gradleak.data import DatasetSpec, load_dataset
    from gradleak.defenses import make_chain
    from gradleak.fl import compute_update
    from gradleak.fl.places import DefenseContext
    from gradleak.guard import Guard, GuardConfig
    from gradleak.guard.trajectory import honest_fedavg
    from gradleak.seeding import stream

    setting, config, clients, rounds = _outbound_case(case, quick, quick_rounds=2)
    data, training, galleries = _clients(setting)
    test = load_dataset(DatasetSpec("mnist", split="test"))
    guard_config = GuardConfig(strongest=(setting["attack"],), start="last", every=setting["every"])

    def initial():
        torch.manual_seed(int(config["seed"]))
        return make_model(config)
    guards = [Guard(guard_config, training=training(1, c), client=c) for c in range(clients)]
    per_round: dict[int, list] = {}
    train_seconds: list[float] = []

    def guarded(number, client, model, update, x, y):
        start = time.perf_counter()
        compute_update(model, x, y, training(number, client))  # the client's own training, timed
        train_seconds.append(time.perf_counter() - start)
        decision = guards[client].outbound(model, update, (x, y), gallery=galleries[client], server_round=number,
                                           training=training(number, client))
        first = decision.audits[0] if decision.audits else None
        last = decision.audits[-1] if decision.audits else None
        per_round.setdefault(number, []).append({
            "client": client, "rung": decision.rung_text, "grade": decision.grade, "sent": decision.send,
            "audited": bool(decision.audits), "seconds": round(decision.seconds, 2), "verdict": decision.reason,
            "evidence": last.attacks_run if last else None,
            "first_audit": {"rung": decision.rung - len(decision.audits) + 1, "leaks": first.leaks,
                            "beyond_chance": first.beyond_chance} if first else None})
        return decision.update

    def federation(send):
        history = list(honest_fedavg(initial(), data, training, rounds, keep=(), send=send, final=True))
        return [_accuracy(r.received, test, evaluate, initial) for r in history[1:]]

    accuracy = {"guarded": federation(guarded)}
    out = {"setting": f"{clients} clients of examples/flower_audit ({config['model']}, "
                      f"{config['examples-per-client']} examples each, {setting['local_epochs']} local epochs of "
                      f"batch {setting['batch_size']}, SGD lr 0.05 momentum 0.9), {rounds} rounds, guard every "
                      f"{setting['every']} round(s) (tolerance {guard_config.tolerance.to_text()}, ladder "
                      f"{'; '.join(r.text for r in guard_config.rungs)}, {setting['attack']}, start at the last rung, "
                      "gallery: 64 other examples of the client's share)",
           "rounds": {}}
    for number, rows in per_round.items():
        out["rounds"][number] = {
            "rungs": _count(r["rung"] for r in rows), "grades": _count(r["grade"] for r in rows),
            "guard_seconds_median_audited": statistics.median([r["seconds"] for r in rows if r["audited"]] or [0.0]),
            "accuracy_after": accuracy["guarded"][number - 1][1], "clients": rows}
    unprotected = [r for rows in per_round.values() for r in rows
                   if r["sent"] and r["rung"] == "none" and r["grade"] not in ("within tolerance", "not audited")]
    graded_leaking = [r for rows in per_round.values() for r in rows
                      if r["first_audit"] and r["first_audit"]["rung"] == 0 and r["first_audit"]["leaks"]]
    audited_seconds = [r["seconds"] for rows in per_round.values() for r in rows if r["audited"]]
    sent = [r for rows in per_round.values() for r in rows if r["sent"]]
    strongest = max((guard_config.rungs.index(next(g for g in guard_config.rungs if g.text == r["rung"])) + 1
                     for r in sent if r["rung"] != "none"), default=0)
    strength = guard_config.rungs[strongest - 1].text if strongest else None
    for label, rung in (("fixed " + (strength or "none"), strength), ("no defense", None)):
        def fixed(number, client, model, update, x, y, rung=rung):
            if rung is None:
                return update
            ctx = DefenseContext(stream(0, "fixed", number, client), {}, training(number, client), model)
            return make_chain([rung]).transform_update(update, ctx)
        accuracy[label] = federation(fixed)
    out.update({"undefended_graded_leaking": len(graded_leaking), "sent_unprotected_while_leaking": len(unprotected),
                "withheld": sum(not r["sent"] for rows in per_round.values() for r in rows),
                "guard_seconds_per_audited_client_round_median": statistics.median(audited_seconds)
                if audited_seconds else None,
                "client_training_seconds_median": round(statistics.median(train_seconds), 4),
                "strongest_rung_sent": strength,
                "final_test_loss_and_accuracy_1000": {k: v[-1] for k, v in accuracy.items()},
                "test_accuracy_per_round": {k: [a for _, a in v] for k, v in accuracy.items()}})
    return out


def screen(quick: bool, case: str = "utility", seed: int | None = None) -> dict:
    """The guard as shipped between audits (`every` rounds, the screen of every round in
    between, climbing from the bottom) against the full audit of every round: a federation of
    the case's clients driven by the screened guard; in each round the screen did not audit, a
    second guard with `every = 1` audits the same update (its own memory, the same seeds), so
    that the two decisions (sent or not, and the rung) can be compared. A scheduled or
    triggered audit is the full audit itself. Reports the agreement, the guard's seconds per
    client-round beside the client's training and the full audit's."""
    from flower_audit.task import make_model

    from gradleak.fl import compute_update
    from gradleak.guard import Guard, GuardConfig, model_drift
    from gradleak.guard.inbound import state_of
    from gradleak.guard.trajectory import honest_fedavg

    setting, config, clients, rounds = _outbound_case(case, quick, quick_rounds=3, seed=seed)
    every = 5
    data, training, galleries = _clients(setting)
    budget = setting.get("time_budget", GuardConfig.time_budget)
    screened_config = GuardConfig(strongest=(setting["attack"],), every=every, time_budget=budget)
    full_config = GuardConfig(strongest=(setting["attack"],), every=1, time_budget=budget)
    screened = [Guard(screened_config, training=training(1, c), client=c) for c in range(clients)]
    full = [Guard(full_config, training=training(1, c), client=c) for c in range(clients)]
    rows: list[dict] = []
    audited_models: dict[int, dict] = {}

    def initial():
        torch.manual_seed(int(config["seed"]))
        return make_model(config)

    def guarded(number, client, model, update, x, y):
        start = time.perf_counter()
        compute_update(model, x, y, training(number, client))  # the client's own training, timed
        train_seconds = time.perf_counter() - start
        decision = screened[client].outbound(model, update, (x, y), gallery=galleries[client], server_round=number,
                                             training=training(number, client))
        audited = bool(decision.audits)
        decisive = screened[client].decisive
        state = state_of(model)
        drift = model_drift(audited_models.get(client, state), state)  # since the client's last audit
        if audited:  # the full audit itself; the shadow guard takes its memory
            audited_models[client] = state
            shadow = decision
            full[client].load_state_dict(screened[client].state_dict())
        else:
            shadow = full[client].outbound(model, update, (x, y), gallery=galleries[client], server_round=number,
                                           training=training(number, client))
        rows.append({"round": number, "client": client, "audited": audited, "decisive": decisive,
                     "norm_ratio": round(float(update.flat().norm()) / screened[client].audited_norm, 3),
                     "model_drift": round(drift, 4),
                     "screened": [decision.send, decision.rung], "full": [shadow.send, shadow.rung],
                     "seconds": round(decision.seconds, 3), "full_seconds": round(shadow.seconds, 2),
                     "rung_audit_seconds": [round(a.seconds, 2) for a in (decision.audits or shadow.audits)],
                     "train_seconds": round(train_seconds, 4)})
        print(rows[-1], file=sys.stderr, flush=True)
        return decision.update

    list(honest_fedavg(initial(), data, training, rounds, keep=(), send=guarded, final=True))
    between = [r for r in rows if not r["audited"]]
    agree = [r for r in rows if r["screened"] == r["full"]]
    seconds = [r["seconds"] for r in rows]
    train = statistics.median(r["train_seconds"] for r in rows)
    return {"setting": f"{clients} clients of examples/flower_audit (seed {config['seed']}, {config['model']}, "
                       f"{config['examples-per-client']} examples each, {setting['local_epochs']} local epochs of "
                       f"batch {setting['batch_size']}), {rounds} rounds, {setting['attack']} within "
                       f"{budget:g} s per rung, default tolerance and "
                       f"ladder, climbing from the bottom; screened: every {every}, drift "
                       f"{screened_config.drift:g} (unless the last audit was decisive), growth "
                       f"{screened_config.growth:g}; full: every round",
            "client_rounds": len(rows), "audited_by_the_screened_guard": len(rows) - len(between),
            "agreeing": len(agree), "agreeing_between_audits": sum(r in agree for r in between),
            "between_audits": len(between),
            "guard_seconds_median": statistics.median(seconds),
            "guard_seconds_mean": round(statistics.mean(seconds), 2),
            "full_audit_seconds_median": statistics.median(r["full_seconds"] for r in rows),
            "rung_audit_seconds_max": max(s for r in rows for s in r["rung_audit_seconds"]),
            "time_budget": budget,
            "client_training_seconds_median": train,
            "guard_over_training_median": round(statistics.median(seconds) / train, 2),
            "guard_over_training_mean": round(statistics.mean(seconds) / train, 2),
            "full_audit_over_training_median": round(statistics.median(r["full_seconds"] for r in rows) / train, 2),
            "rows": rows}


def repeat(quick: bool, case: str = "utility", seed: int | None = None) -> dict:
    """The full audit against itself: every client-round of the case's federation audited by two
    guards that differ only in the attack's seed (`GuardConfig.seed` 0 and 1), each with its own
    memory, both climbing from the bottom, on the same update. Their agreement (sent or not, and
    the rung) is the most any cheaper predictor of the full audit can be measured to agree with
    it; the first audit's grade and linkage beside it say where the two differ."""
    from flower_audit.task import make_model

    from gradleak.guard import Guard, GuardConfig
    from gradleak.guard.trajectory import honest_fedavg

    setting, config, clients, rounds = _outbound_case(case, quick, quick_rounds=2, seed=seed)
    data, training, galleries = _clients(setting)
    budget = setting.get("time_budget", GuardConfig.time_budget)
    pairs = [[Guard(GuardConfig(strongest=(setting["attack"],), every=1, seed=seed, time_budget=budget),
                    training=training(1, c), client=c) for seed in (0, 1)] for c in range(clients)]
    rows: list[dict] = []

    def initial():
        torch.manual_seed(int(config["seed"]))
        return make_model(config)

    def first(decision):
        audit = decision.audits[0] if decision.audits else None
        return None if audit is None else {"leaks": audit.leaks, "beyond_chance": audit.beyond_chance,
                                           "grade": decision.grade, "decisive": audit.decisive,
                                           "linkage": [r["linkage"] for r in audit.attacks_run]}

    def guarded(number, client, model, update, x, y):
        decisions = [g.outbound(model, update, (x, y), gallery=galleries[client], server_round=number,
                                training=training(number, client)) for g in pairs[client]]
        rows.append({"round": number, "client": client,
                     "decisions": [[d.send, d.rung] for d in decisions],
                     "decisive": [g.decisive for g in pairs[client]],
                     "first_audits": [first(d) for d in decisions],
                     "seconds": [round(d.seconds, 2) for d in decisions],
                     "rung_audit_seconds": [round(a.seconds, 2) for d in decisions for a in d.audits]})
        print(rows[-1], file=sys.stderr, flush=True)
        return decisions[0].update

    list(honest_fedavg(initial(), data, training, rounds, keep=(), send=guarded, final=True))
    agree = [r for r in rows if r["decisions"][0] == r["decisions"][1]]
    decisive = [r for r in rows if all(r["decisive"])]
    first_agree = [r for r in rows if r["first_audits"][0] and r["first_audits"][1]
                   and r["first_audits"][0]["leaks"] == r["first_audits"][1]["leaks"]]
    return {"setting": f"{clients} clients of examples/flower_audit (seed {config['seed']}, {config['model']}, "
                       f"{config['examples-per-client']} examples each, {setting['local_epochs']} local epochs of "
                       f"batch {setting['batch_size']}), {rounds} rounds, {setting['attack']}, default tolerance and "
                       f"ladder, climbing from the bottom, every round audited twice (attack seeds 0 and 1), "
                       f"{budget:g} s per rung",
            "client_rounds": len(rows), "agreeing": len(agree),
            "plain_update_leak_call_agreeing": len(first_agree),
            "both_decisive": len(decisive), "both_decisive_agreeing": sum(r in agree for r in decisive),
            "full_audit_seconds_median": statistics.median(s for r in rows for s in r["seconds"]),
            "rung_audit_seconds_max": max(s for r in rows for s in r["rung_audit_seconds"]), "time_budget": budget,
            "rows": rows}


def stealthy(quick: bool) -> dict:
    """The disguised scale-mia against the guard in a client's first round (no earlier model to
    compare with): the model it sends passes the inbound checks or not; the guard's outbound audit
    (its defaults) of the update the client trains on it, and what the attack then reconstructs,
    through the pipeline (`run_attack`), from the update as trained and through the rung the guard
    chose. FedSGD (one step of the client's examples, lr 0.1), the ReLU LeNet-5, MNIST test split;
    the server calibrates without held-out data (`--threat malicious`)."""
    from gradleak.attacks import AttackContext, make_attack
    from gradleak.data.references import resolve_data, run_order
    from gradleak.fl import TrainingSpec, compute_update
    from gradleak.guard import Guard, GuardConfig, check_received
    from gradleak.run.experiment import AttackRunSpec, run_attack
    from gradleak.run.scenario.assembly import scenario_model

    seeds = (1, 2) if quick else (1, 2, 3, 4, 5, 6)
    rows = []
    for batch in ((8,) if quick else (8, 64)):
        for seed in seeds:
            spec = AttackRunSpec(dataset="mnist", model="lenet5", activation="relu", attack="scale-mia",
                                 batch_size=batch, seed=seed, threat="malicious", lpips="none")
            data = resolve_data(spec.dataset, spec.split, spec.resize, spec.seq_len).dataset
            model = scenario_model(spec, data)
            attack = make_attack(spec.attack)
            crafted = attack.prepare_model(model, data.input_shape, data.num_classes, AttackContext(seed=seed)).model
            inbound = check_received(crafted)
            order = run_order(len(data), seed)
            x, y = data.inputs[order[:batch]], data.labels[order[:batch]]
            gallery = data.inputs[order[batch:batch + 64]]
            training = TrainingSpec(lr=0.1)
            update = compute_update(crafted, x, y, training)
            decision = Guard(GuardConfig(), training=training).outbound(crafted, update, (x, y), gallery=gallery,
                                                                         training=training)
            def judged(result):
                return {"recognizable": result.metrics["recognizable"], "asr": result.metrics["asr"],
                        "decision": result.extras["ladder"]["decision"]}
            plain = judged(run_attack(spec))
            through = (judged(run_attack(dataclasses.replace(spec, defenses=(decision.rung_text,))))
                       if decision.send and decision.rung > 0 else plain if decision.send else None)
            rows.append({"batch": batch, "seed": seed, "inbound": inbound.summary(),
                         "guard": {"send": decision.send, "rung": decision.rung_text, "grade": decision.grade,
                                   "seconds": round(decision.seconds, 1)},
                         "plain": plain, "sent": through})
            print(rows[-1], file=sys.stderr, flush=True)
    return {"setting": "scale-mia (disguised) on the ReLU LeNet-5, MNIST test split, FedSGD lr 0.1, a client's "
                       "first round; the guard at its defaults (gallery: 64 other examples)",
            "missed_inbound": sum(r["inbound"] == "no sign of a crafted model" for r in rows),
            "client_rounds": len(rows),
            "withheld": sum(not r["guard"]["send"] for r in rows),
            # the attack's own run through the rung sent, judged by the pipeline's ladder
            "sent_while_leaking": sum(r["sent"] is not None and r["sent"]["decision"] == "leak" for r in rows),
            "rows": rows}


def chance(quick: bool, case: str = "utility") -> dict:
    """The leak rule on updates that carry nothing: for each client of the case, its round-1
    update replaced by Gaussian noise at the real update's RMS per tensor, attacked by the
    guard's attack: how often the measured rates are above the tolerance (the guard would climb)
    and how often beyond chance (it would withhold at the top rung)."""
    from flower_audit.task import client_data, make_model

    from gradleak.fl import compute_update
    from gradleak.guard import audit_outbound
    from gradleak.leakage import parse_tolerance

    setting = OUTBOUND[case]
    config = setting["config"]
    clients = 2 if quick else 6
    training = _training(setting)
    rows = []
    for client in range(clients):
        x, y = client_data(client, 10, config)
        torch.manual_seed(int(config["seed"]))
        model = make_model(config)
        update = compute_update(model, x, y, training(1, client))
        g = torch.Generator().manual_seed(1000 + client)
        noise = update.replace(tensors={k: torch.randn(v.shape, generator=g) * v.pow(2).mean().sqrt()
                                        for k, v in update.tensors.items()})
        audit = audit_outbound(model, noise, x, y, training=training(1, client), attacks=[setting["attack"]],
                               gallery=_other_examples(client, config), tolerance=parse_tolerance(None))
        rows.append({"client": client, "leaks": audit.leaks, "beyond_chance": audit.beyond_chance,
                     "evidence": audit.attacks_run, "seconds": round(audit.seconds, 1)})
    return {"setting": f"{case} case's clients, round 1, the update replaced by Gaussian noise at its RMS",
            "clients": clients, "above_tolerance": sum(r["leaks"] for r in rows),
            "beyond_chance": sum(r["beyond_chance"] for r in rows), "rows": rows}


def top_rung(quick: bool, case: str = "utility") -> dict:
    """What one audit measures, later in training: on the honest trajectory's rounds 5 and 8 (2 in
    `--quick`), each client's plain update, the same update under the ladder's top rung, and a
    content-free update (Gaussian noise at each tensor's RMS), each audited once by the case's
    attack: the grade, linkage and whether beyond chance. Shows whether the top rung stops the
    attack and how far the audit's linkage over a client's examples moves on its own."""
    from flower_audit.task import client_data, make_model

    from gradleak.defenses import make_chain
    from gradleak.fl.places import DefenseContext
    from gradleak.guard import DEFAULT_LADDER, audit_outbound
    from gradleak.guard.trajectory import honest_fedavg
    from gradleak.leakage import parse_tolerance
    from gradleak.seeding import stream

    setting = OUTBOUND[case]
    config = setting["config"]
    clients, rounds = (2, (2,)) if quick else (setting["clients"], (5, 8))
    data = [client_data(i, 10, config) for i in range(clients)]
    training = _training(setting)
    torch.manual_seed(int(config["seed"]))
    rows = []
    for past in honest_fedavg(make_model(config), data, training, max(rounds), keep=None):
        if past.number not in rounds:
            continue
        for client, update in past.updates.items():
            x, y = data[client]
            model = make_model(config)
            model.load_state_dict(past.received)
            g = torch.Generator().manual_seed(1000 + client)
            content_free = update.replace(tensors={k: torch.randn(v.shape, generator=g) * v.pow(2).mean().sqrt()
                                                   for k, v in update.tensors.items()})
            context = DefenseContext(stream(0, "top rung", past.number, client), {}, training(past.number, client),
                                     model)
            top = make_chain([DEFAULT_LADDER[-1]]).transform_update(update, context)
            row: dict = {"round": past.number, "client": client, "update_norm": round(float(update.flat().norm()), 3)}
            for name, sent in (("plain", update), (DEFAULT_LADDER[-1], top), ("content-free", content_free)):
                audit = audit_outbound(model, sent, x, y, training=training(past.number, client),
                                       attacks=[setting["attack"]], gallery=_other_examples(client, config),
                                       tolerance=parse_tolerance(None))
                row[name] = {"leaks": audit.leaks, "beyond_chance": audit.beyond_chance, "reason": audit.reason}
            print(row, file=sys.stderr, flush=True)
            rows.append(row)
    return {"setting": f"{case} case's clients, honest trajectory rounds {list(rounds)}, {setting['attack']}",
            "rows": rows}


def _other_examples(partition: int, config: dict):
    from types import SimpleNamespace

    from flower_audit.guard import other_examples

    return other_examples(SimpleNamespace(run_config=config, node_config={
        "partition-id": partition, "num-partitions": 10}))


def _accuracy(state, test, evaluate, initial) -> list[float]:
    loss, accuracy = evaluate(_load(initial, state), test.inputs[:1000], test.labels[:1000])
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
    from flower_audit.task import initial_model, make_model

    config = tomllib.loads((EXAMPLES / "flower_audit" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    config.update({"guard": True, "guard-attacks": "ig:iterations=100", "guard-start": "last",
                   "model": "sigmoid-cnn", "examples-per-client": 8})  # the small configuration
    clients = 3 if quick else 10
    contexts = [Context(run_id=1, node_id=100 + c, node_config={"partition-id": c, "num-partitions": 10},
                        state=RecordDict(), run_config=config) for c in range(clients)]
    global_state = initial_model(config).state_dict()
    out: dict = {}
    for number in (1, 2, 3):
        sent = global_state
        if number == 2:
            crafted = make_attack("rtf").prepare_model(_load(lambda: make_model(config), global_state), MNIST, 10,
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


CASES = ("inbound", "flower_app", "outbound", "chance", "utility", "screen", "repeat", "screen_example",
         "repeat_example", "stealthy", "top_rung")


def run(quick: bool = False, cases=CASES, seed: int = 0) -> dict:
    torch.set_num_threads(1)
    _apps_on_path()
    out: dict = {}
    for case in cases:
        start = time.perf_counter()
        if case == "utility":
            out[case] = outbound(quick, "utility")
        elif case in ("screen_example", "repeat_example"):  # the same cases at the example's real partitions
            out[case] = (screen if case == "screen_example" else repeat)(quick, "example", seed)
        else:
            out[case] = {"inbound": inbound, "flower_app": flower_app, "outbound": outbound,
                         "chance": chance, "screen": screen, "repeat": repeat, "stealthy": stealthy,
                         "top_rung": top_rung}[case](quick)
        out[f"{case}_seconds"] = round(time.perf_counter() - start, 1)
    return out


def run_with(argv: list[str]) -> dict:
    parser = common.parser("guard")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), metavar="CASE",
                        help=f"the cases to run (default: all of {', '.join(CASES)})")
    parser.add_argument("--seed", type=int, default=0,
                        help="the example app's seed (its partitions and initial model) in screen_example and "
                             "repeat_example (default 0, the example's own)")
    args = parser.parse_args(argv)
    return run(args.quick, tuple(args.cases), args.seed)
