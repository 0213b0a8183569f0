"""`AuditStrategy`: wraps a Flower message-based strategy without changing what it does."""
from __future__ import annotations

from flwr.serverapp.strategy import Strategy

from ..fl import TrainingSpec


class AuditStrategy(Strategy):
    """Delegates every step to the wrapped strategy; on audited rounds it keeps the
    arrays sent for training and attacks the replies before they are aggregated."""

    def __init__(self, strategy: Strategy, audit, training: TrainingSpec, run_config: dict):
        self.strategy = strategy
        self.audit = audit
        self.training = training
        self.run_config = run_config  # what each client's shuffling seed is derived from
        self._sent: dict[int, dict] = {}

    def __repr__(self) -> str:
        return f"gradleak audit of {self.strategy!r}"

    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(self, server_round, arrays, config, grid):
        if server_round in self.audit.rounds:
            self._sent[server_round] = {k: v.detach().clone() for k, v in arrays.to_torch_state_dict().items()}
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        sent = self._sent.pop(server_round, None)
        if sent is not None:
            self.audit.audit_round(server_round, sent, replies, self.training, self.run_config)
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round, arrays, config, grid):
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        return self.strategy.aggregate_evaluate(server_round, replies)

    def __getattr__(self, name):
        # Anything else the wrapped strategy offers (privacy_spent, weighted_by_key, ...).
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)
