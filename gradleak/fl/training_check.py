"""The declared-training check: replaying the training a client declared, on its ground-truth
examples, from the weights the server sent, must reproduce the update the server captured;
otherwise the attacks (which replay that declaration) may understate the leak."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .client import compute_update
from .training import TrainingSpec
from .update import Update

# A captured update is reproduced by the declared training when replaying that training on the
# ground truth lands within this fraction of the update's largest entry: between float32
# rounding and the subtlest mis-declaration measured (docs/flower.md).
TRAINING_CHECK_TOLERANCE = 1e-4


class TrainingMismatchWarning(UserWarning):
    """The declared training, replayed on the ground truth, does not reproduce the captured update."""


@dataclass(frozen=True)
class TrainingCheck:
    """Whether the declared training, replayed on the client's ground-truth examples from the
    weights the server sent, reproduces the update the server captured."""

    checked: bool
    difference: float | None = None  # max |captured - replayed| / max |replayed|
    tolerance: float = TRAINING_CHECK_TOLERANCE
    note: str = ""  # why it was not checked, or the mismatch in words

    @property
    def confirmed(self) -> bool | None:
        """True or False when checked, None when the update could not be checked."""
        return None if self.difference is None else self.difference <= self.tolerance

    def to_dict(self) -> dict:
        return {"checked": self.checked, "confirmed": self.confirmed, "difference": self.difference,
                "tolerance": self.tolerance, "note": self.note}



def check_declared_training(model: nn.Module, update: Update, inputs: torch.Tensor, labels: torch.Tensor,
                            training: TrainingSpec, defenses: Sequence[str] = ()) -> TrainingCheck:
    """Replay the declared `training` from the sent `model` on the client's ground-truth
    `inputs`/`labels` (in the order its data loader indexes them) and compare with the captured
    `update`: the difference is the largest entry-wise gap relative to the replayed update's
    largest entry. Not checked (confirmed None) when something random the auditor cannot
    replay touched the update: declared defenses, an unknown batch order, augmentation, active
    dropout, or other clients' updates summed in."""
    why_not = _why_training_unchecked(model, update, training, defenses)
    if why_not:
        return TrainingCheck(False, note=why_not)
    sent = copy.deepcopy(model).to("cpu")
    replayed = compute_update(sent, inputs.detach().cpu(), labels.detach().cpu(), training)
    expected = {n: t.double() for n, t in replayed.tensors.items()}
    captured = {n: t.detach().cpu().double() for n, t in update.tensors.items()}
    # one plain-SGD step replays as a gradient; a delta of it is lr × that gradient
    if replayed.kind == "gradient" and update.kind == "delta":
        expected = {n: t * training.lr for n, t in expected.items()}
    elif replayed.kind == "delta" and update.kind == "gradient":
        captured = {n: t * training.lr for n, t in captured.items()}
    names = sorted(expected.keys() | captured.keys())  # a tensor only one side has counts as zeros
    pairs = [(captured[n] if n in captured else torch.zeros_like(expected[n]),
              expected[n] if n in expected else torch.zeros_like(captured[n])) for n in names]
    gap = max(float((c - e).abs().max()) for c, e in pairs)
    scale = max(float(e.abs().max()) for _, e in pairs) or max(float(c.abs().max()) for c, _ in pairs) or 1.0
    difference = gap / scale
    if difference <= TRAINING_CHECK_TOLERANCE:
        return TrainingCheck(True, difference, note="the declared training reproduces the captured update")
    flat_c = torch.cat([c.reshape(-1) for c, _ in pairs])
    flat_e = torch.cat([e.reshape(-1) for _, e in pairs])
    cosine = float(torch.nn.functional.cosine_similarity(flat_c, flat_e, dim=0))
    ratio = float(flat_c.norm() / flat_e.norm()) if float(flat_e.norm()) else math.inf
    return TrainingCheck(True, difference, note=(
        f"replaying the declared training ({_training_text(training, len(inputs))}) on the ground truth "
        f"gives an update that differs from the captured one by {difference:.2g} of its largest entry "
        f"(tolerance {TRAINING_CHECK_TOLERANCE:g}; cosine {cosine:.3f}, norm ratio {ratio:.3g}): the client's "
        "optimizer or its options, learning rate, local epochs, batch size or batch order likely differ from "
        "the declaration, or a client-side step (clipping, noise, compression) changed the update; the "
        "attacks replayed the declared training, so they may understate the leak"))


def _why_training_unchecked(model: nn.Module, update: Update, training: TrainingSpec,
                            defenses: Sequence[str]) -> str | None:
    if defenses:
        return f"the declared defenses ({', '.join(defenses)}) change the update beyond what the auditor replays"
    if update.clients > 1:
        return f"the update sums {update.clients} clients' updates"
    if not training.replayable:
        return "the client's batch order or augmentation draws are unknown to the auditor"
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0 for m in model.modules()):
        return "the model's dropout masks are drawn by the client and unknown to the auditor"
    return None


def _training_text(training: TrainingSpec, samples: int) -> str:
    steps, batch = training.num_steps(samples), training.step_batch_size(samples)
    epochs = f" over {training.local_epochs} epoch(s)" if training.local_epochs is not None else ""
    order = {"known": f"shuffled with seed {training.shuffle_seed}", "none": "in order"}.get(training.order,
                                                                                             training.order)
    return f"{training.optimizer}, lr {training.lr:g}, {steps} step(s) of batch {batch}{epochs}, {order}"
