"""Originals-vs-reconstructions image grids."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image


def image_grid(rows: list[torch.Tensor], scale: int | None = None, pad: int = 2) -> Image.Image:
    """Stack image batches (N, C, H, W) in [0, 1] as rows of one RGB picture."""
    n = max(r.shape[0] for r in rows)
    c, h, w = rows[0].shape[1:]
    scale = scale or max(1, 64 // max(h, w))
    H, W = h * scale, w * scale
    canvas = np.ones((len(rows) * (H + pad) + pad, n * (W + pad) + pad, 3), dtype=np.uint8) * 255
    for ri, batch in enumerate(rows):
        for ci in range(batch.shape[0]):
            img = batch[ci].detach().float().clamp(0, 1)
            if img.shape[0] == 1:
                img = img.expand(3, -1, -1)
            arr = (img.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            arr = arr.repeat(scale, 0).repeat(scale, 1)
            y0, x0 = pad + ri * (H + pad), pad + ci * (W + pad)
            canvas[y0:y0 + H, x0:x0 + W] = arr
    return Image.fromarray(canvas)


def save_grid(path: str | Path, originals: torch.Tensor, reconstructions: torch.Tensor) -> Path:
    """Top row originals, bottom row their matched reconstructions (PNG)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    image_grid([originals, reconstructions]).save(tmp)
    tmp.replace(path)
    return path


def pairs_thumbnail(pairs: list[tuple[bytes, bytes]], limit: int = 8) -> bytes:
    """PNG bytes of the first `limit` (original, reconstruction) PNG pairs as a two-row grid:
    a large batch's full grid is too wide to read as a thumbnail."""
    import io

    def tensor(png: bytes) -> torch.Tensor:
        arr = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32) / 255.0
        return torch.from_numpy(arr).permute(2, 0, 1)

    pairs = pairs[:limit]
    originals = torch.stack([tensor(o) for o, _ in pairs])
    reconstructions = torch.stack([tensor(r) for _, r in pairs])
    buf = io.BytesIO()
    image_grid([originals, reconstructions], scale=1).save(buf, format="PNG")
    return buf.getvalue()
