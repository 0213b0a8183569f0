"""What each kind of data is, in one place: what a model reads, how a batch is scored and
whether examples are pictures. The pipeline asks `modality(name)` rather than comparing
names, so a new kind of data is one more record here (and its scorer in gradleak.metrics)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import GradleakError


@dataclass(frozen=True)
class Modality:
    name: str
    input_dtype: torch.dtype  # what a model reads: floats, or integer token ids
    pixels: bool  # inputs are images in [0, 1]: clamped when scored, PSNR/SSIM/LPIPS, rendered as pictures
    tokens: bool  # inputs are token sequences: scored by ROUGE and exact match, rendered as text

    def clamp(self, x: torch.Tensor) -> torch.Tensor:
        """A reconstruction brought into the data's range: pixels into [0, 1], other data as is."""
        return x.clamp(0, 1) if self.pixels else x

    def probe_inputs(self, count: int, input_shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """`count` random inputs of the data's kind, to probe a model's response with: uniform
        in [0, 1] (pixels, or as a stand-in for any other bounded input), standard normal for
        standardised features. The uniform draw is always made first, so a generator ends in
        the same state whatever the data."""
        x = torch.rand((count, *input_shape), generator=generator)
        return x if self.pixels or self.tokens else torch.randn((count, *input_shape), generator=generator)

    def example(self, input_shape: tuple[int, ...]) -> torch.Tensor:
        """One all-zero input of `input_shape` (token id 0 for text), to probe a model with."""
        return torch.zeros((1, *input_shape), dtype=self.input_dtype)


MODALITIES: dict[str, Modality] = {
    "image": Modality("image", torch.float32, pixels=True, tokens=False),
    "tabular": Modality("tabular", torch.float32, pixels=False, tokens=False),
    "text": Modality("text", torch.int64, pixels=False, tokens=True),
}


def modality(name: str) -> Modality:
    """The record of a modality by name ("image", "tabular", "text")."""
    try:
        return MODALITIES[name]
    except KeyError:
        raise GradleakError(f"unknown modality '{name}'; choose from: {', '.join(MODALITIES)}") from None
