"""What each kind of data is, in one place: what a model reads, how a batch is scored and
what counts as a copy, how a reconstruction is re-identified, how it is shown (in the
report and on the terminal), and which attacks fit it. The pipeline asks `modality(name)`
rather than comparing names, and readers of a results store take a row's modality from
the store (it records it), never from which metrics a row holds or a tensor's rank; so a
new kind of data is one more record here (and its scorer in gradleak.metrics)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch

from ..errors import GradleakError


@dataclass(frozen=True)
class Score:
    """One score of a modality's headline, as the report and the terminal print it."""

    key: str  # the metric's name in a row's metrics
    title: str
    unit: str = ""
    digits: int = 2  # significant digits in the report
    spec: str = ".2f"  # format on the terminal


@dataclass(frozen=True)
class Modality:
    name: str
    input_dtype: torch.dtype  # what a model reads: floats, or integer token ids
    pixels: bool  # inputs are images in [0, 1]: clamped when scored, PSNR/SSIM/LPIPS, rendered as pictures
    tokens: bool  # inputs are token sequences: scored by ROUGE and exact match, rendered as text
    # how a batch is scored (a "module:function" reference, imported by gradleak.metrics)
    scorer: str = "gradleak.metrics.scoring:score_batch"
    # the scores a row is summed up by, headline first (the matrix, the Flower lines, the terminal)
    scores: tuple[Score, ...] = ()
    # when a reconstructed example counts as a copy of its original (ASR, gradleak.metrics)
    copy_criterion: str = "MSE to the original at most 1e-3 (gradleak.metrics.scoring.ASR_MSE_THRESHOLD)"
    # the distance a reconstruction is re-identified by among a gallery (gradleak.metrics.reidentify;
    # pictures add LPIPS where the backbone can read them)
    reid_distance: Literal["ssim", "l2", "tokens"] = "l2"
    # distances that enter the linkage AUC beside re-identification's (docs/judging.md: pictures
    # add pixel correlation, which reads the partial, noise-like reconstructions SSIM and LPIPS miss)
    linkage_extra: tuple[Literal["pearson"], ...] = ()
    # the range a reconstruction is brought into before it is scored (None: as it is)
    value_range: tuple[float, float] | None = None
    # which of two reconstructions is better: these metrics in turn (name, higher is better)
    best_by: tuple[tuple[str, bool], ...] = (("mse", False),)

    @property
    def headline(self) -> str:
        """The metric a row of this data is judged and plotted by first."""
        return self.scores[0].key

    def rank(self, metrics: dict) -> tuple[float, ...]:
        """A sort key of a reconstruction's metrics, lower is better (`best_by`); a missing
        score ranks last."""
        def value(key: str, higher: bool) -> float:
            v = metrics.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return math.inf
            return -v if higher else v
        return tuple(value(key, higher) for key, higher in self.best_by)

    def clamp(self, x: torch.Tensor) -> torch.Tensor:
        """A reconstruction brought into the data's range: pixels into [0, 1], other data as is."""
        return x.clamp(*self.value_range) if self.value_range is not None else x

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

    def refuses(self, attack: Any) -> str | None:
        """Why `attack` does not fit this data (its `modalities` leave it out), or None: the
        one compatibility check between an attack and a modality."""
        return None if self.name in getattr(attack, "modalities", ()) else f"does not handle {self.name} data"

    def score_words(self, metrics: dict, fmt: Callable[[Any, int], str], separator: str = " · ") -> str:
        """The row's headline scores in words for the report ("PSNR 21.3 dB · SSIM 0.71")."""
        return separator.join(f"{s.title} {fmt(metrics.get(s.key), s.digits)}{s.unit}" for s in self.scores)

    def score_line(self, metrics: dict, separator: str = "  ") -> str | None:
        """The row's headline scores for the terminal ("PSNR 21.3 dB  SSIM 0.71"); None without
        a headline value."""
        if metrics.get(self.headline) is None:
            return None
        def shown(score: Score) -> str:
            value = metrics.get(score.key)
            return "n/a" if value is None else f"{format(value, score.spec)}{score.unit}"
        return separator.join(f"{s.title} {shown(s)}" for s in self.scores)


MODALITIES: dict[str, Modality] = {
    "image": Modality("image", torch.float32, pixels=True, tokens=False,
                      scores=(Score("psnr", "PSNR", " dB", 3, ".1f"), Score("ssim", "SSIM", "", 2, ".2f")),
                      reid_distance="ssim", linkage_extra=("pearson",), value_range=(0.0, 1.0),
                      best_by=(("mse", False), ("psnr", True))),
    "tabular": Modality("tabular", torch.float32, pixels=False, tokens=False,
                        scores=(Score("mse", "MSE", "", 3, ".3g"),)),
    "text": Modality("text", torch.int64, pixels=False, tokens=True,
                     scorer="gradleak.metrics.text:score_sequences",
                     scores=(Score("rouge1", "ROUGE-1"), Score("rouge2", "ROUGE-2")),
                     copy_criterion="the sequence recovered token for token", reid_distance="tokens",
                     best_by=(("rouge1", True),)),
}


def modality(name: str) -> Modality:
    """The record of a modality by name ("image", "tabular", "text")."""
    try:
        return MODALITIES[name]
    except KeyError:
        raise GradleakError(f"unknown modality '{name}'; choose from: {', '.join(MODALITIES)}") from None


def stored_modality(name: str | None) -> Modality:
    """The record of a store row's modality; a row that records none (and has no evidence for
    the legacy rule) is summed up by its MSE, as tabular records are."""
    return MODALITIES[name] if name in MODALITIES else MODALITIES["tabular"]


def modality_of_tensors(inputs: torch.Tensor) -> str:
    """The modality a user's own tensors declare by their form, read once where they enter
    (gradleak.data.tensors), the one place a modality is read from a tensor: integer (N, T)
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
