"""Images: float pictures in [0, 1], (C, H, W) per example. Scored by PSNR, SSIM and LPIPS
after clamping into range, re-identified by SSIM (and LPIPS where its backbone can read
them), augmented by random crops and flips, kept and shown as picture grids."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..registry import import_reference
from .base import PICTURE_OPTIONS, Modality, ReidDistance, Score, V, View


@dataclass(frozen=True)
class Image(Modality):
    def probe_inputs(self, count: int, input_shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """`count` random pictures, uniform in [0, 1]."""
        return torch.rand((count, *input_shape), generator=generator)

    def picture_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...] | None:
        return tuple(input_shape)

    def augmented(self, x: torch.Tensor, augment: tuple[str, ...], padding: int,
                  generator: torch.Generator) -> torch.Tensor:
        """Every example randomly cropped from its zero-padded self and/or flipped horizontally
        (probability 0.5), as torchvision's RandomCrop(size, padding) and RandomHorizontalFlip
        do; a batch of pictures (N, C, H, W) only."""
        if x.dim() != 4:
            return x
        n, _, h, w = x.shape
        out = x
        if "crop" in augment and padding > 0:
            padded = F.pad(x, (padding, padding, padding, padding))
            offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=generator).tolist()
            out = torch.stack([padded[k, :, i:i + h, j:j + w] for k, (i, j) in enumerate(offsets)])
        if "flip" in augment:
            flips = torch.rand(n, generator=generator) < 0.5
            out = torch.where(flips.view(-1, 1, 1, 1).to(out.device), out.flip(-1), out)
        return out

    def reid_distances(self, input_shape: tuple[int, ...], lpips: str) -> tuple[ReidDistance, ...]:
        """SSIM, and LPIPS where its backbone can read pictures of this shape."""
        if lpips != "none" and import_reference("gradleak.metrics.reidentify:lpips_reads")(input_shape):
            return (self.reid_distance, "lpips")
        return (self.reid_distance,)

    def record(self, originals: torch.Tensor, reconstructions: torch.Tensor, per_example: list[dict],
               numeric: Callable[[dict], dict], pictures: bool) -> tuple[bytes | None, list[dict], dict]:
        """The grid and each example's pair of pictures as PNG bytes (`pictures=False`: none)."""
        if not pictures:
            return super().record(originals, reconstructions, per_example, numeric, pictures)
        import io

        from ..viz import image_grid

        def png(image) -> bytes:
            buf = io.BytesIO()
            image.save(buf, format="PNG")
            return buf.getvalue()

        grid = png(image_grid([originals, reconstructions]))
        images = [{"idx": i, "metrics": numeric(score),
                   "original": png(image_grid([originals[i:i + 1]], pad=0)),
                   "reconstruction": png(image_grid([reconstructions[i:i + 1]], pad=0))}
                  for i, score in enumerate(per_example)]
        return grid, images, {}

    def write_files(self, out: Path, originals: torch.Tensor, reconstructions: torch.Tensor,
                    per_example: list[dict], write: Callable[[Path, str], None]) -> dict[str, Path]:
        """grid.png: the originals over their reconstructions."""
        from ..viz import save_grid

        save_grid(out / "grid.png", originals, reconstructions)
        return {"grid": out / "grid.png"}

    def shown(self, view: View[V]) -> V:
        return view.pictures()

    def gallery_caption(self, metrics: dict, fmt: Callable[[Any, int], str]) -> str:
        """The headline score alone: the grid shows the rest."""
        headline = self.scores[0]
        return f"{headline.title} {fmt(metrics.get(headline.key), headline.digits)}"

    def outcome_headline(self, metrics: dict) -> str | None:
        return self._headline_words(metrics)


PSNR = Score("psnr", "PSNR", " dB", 3, ".1f")

IMAGE = Image("image", torch.float32, scorer="gradleak.metrics.scoring:score_pictures",
              scores=(PSNR, Score("ssim", "SSIM", "", 2, ".2f")),
              reid_distance="ssim", linkage_extra=("pearson",), value_range=(0.0, 1.0),
              best_by=(("mse", False), ("psnr", True)), augmentations=("crop", "flip"),
              dataset_options=PICTURE_OPTIONS, plotted_by="psnr", table_score=PSNR)
