"""Shared helpers of the sparsifying defenses (prune, topk, dgc)."""
from __future__ import annotations

import torch


def magnitude_mask(t: torch.Tensor, drop: float) -> torch.Tensor:
    """Boolean mask keeping the round((1-drop)·n) largest-magnitude entries of `t`."""
    n = t.numel()
    keep = n - int(round(drop * n))
    mask = torch.zeros(n, dtype=torch.bool, device=t.device)
    if keep > 0:
        mask[t.reshape(-1).abs().topk(keep).indices] = True
    return mask.view_as(t)


def sparsify(tensors: dict[str, torch.Tensor], drop: float, per_tensor: bool) -> dict[str, torch.Tensor]:
    """Zero the fraction `drop` of smallest-magnitude entries, per tensor or over all of them."""
    if per_tensor:
        return {n: t * magnitude_mask(t, drop) for n, t in tensors.items()}
    flat = torch.cat([t.reshape(-1) for t in tensors.values()])
    mask = magnitude_mask(flat, drop)
    out, offset = {}, 0
    for n, t in tensors.items():
        out[n] = t * mask[offset:offset + t.numel()].view_as(t)
        offset += t.numel()
    return out
