"""Client simulation: what a federated client computes and sends."""
from .update import Update
from .training import TrainingSpec
from .client import compute_update, aggregate_updates
from .local import local_update, batch_loss

__all__ = ["Update", "TrainingSpec", "compute_update", "aggregate_updates", "local_update", "batch_loss"]
