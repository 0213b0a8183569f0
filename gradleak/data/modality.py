"""Which modality data declare, in the two places it is read rather than recorded: a user's
own tensors where they enter, and a store row written before stores recorded it. What each
modality is and does lives in gradleak.modalities; everywhere else the pipeline carries the
name it was given and readers of a results store take a row's modality from the store."""
from __future__ import annotations

import torch


def modality_of_tensors(inputs: torch.Tensor) -> str:
    """The modality a user's own tensors declare by their form, read where they enter
    (gradleak.data.tensors) and by a client's augmentation that was given none (gradleak.fl.local),
    the only places a modality is read from a tensor: integer (N, T)
    ids are token sequences, (N, H, W) and (N, C, H, W) are images, anything else is tabular
    rows (whose shape the caller checks)."""
    if inputs.dim() == 2 and not inputs.dtype.is_floating_point and inputs.dtype != torch.bool \
            and not inputs.is_complex():
        return "text"
    return "image" if inputs.dim() in (3, 4) else "tabular"


def legacy_modality(metrics: dict, has_sequences: bool, has_grid: bool) -> str | None:
    """The legacy path: the modality of a store row written before stores recorded it
    (gradleak.store's schema version 1), or by a writer that declared none, from what the row
    holds — a picture grid or PSNR (image), stored sequences or ROUGE (text), an MSE alone
    (tabular); None without evidence. The only place a modality is guessed from metrics."""
    if has_grid or metrics.get("psnr") is not None:
        return "image"
    if has_sequences or metrics.get("rouge1") is not None:
        return "text"
    if metrics.get("mse") is not None:
        return "tabular"
    return None
