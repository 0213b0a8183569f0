"""Client simulation: what a federated client computes and sends."""
from .client import aggregate_updates, compute_update
from .local import batch_loss, local_update
from .training import TrainingSpec
from .update import Update

__all__ = ["Update", "TrainingSpec", "compute_update", "aggregate_updates", "local_update", "batch_loss"]
