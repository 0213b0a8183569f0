"""The ServerApp: FedAvg for `num-server-rounds` rounds (of the weights, or of the LoRA adapters)."""
from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flower_text.audit import audit
from flower_text.guard import guard
from flower_text.task import client_model, sent_arrays

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    guard.check(cfg)  # gradleak's client-side guard: a bad guard-* value stops the run here, before round 1
    strategy = FedAvg(fraction_train=float(cfg["fraction-train"]), fraction_evaluate=0.0)
    # gradleak's hook: attack the updates the server receives on the audited rounds.
    strategy = audit.wrap(strategy, cfg)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(sent_arrays(client_model(cfg))),
                   train_config=ConfigRecord({"lr": float(cfg["lr"])}), num_rounds=int(cfg["num-server-rounds"]))
