"""Tabular records: standardised float feature rows, scored and re-identified by their
distances to the originals, shown as numbers. The contract's defaults are theirs."""
from __future__ import annotations

import torch

from .base import Modality, Score

TABULAR = Modality("tabular", torch.float32, scores=(Score("mse", "MSE", "", 3, ".3g"),))
