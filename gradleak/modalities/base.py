"""The contract of a modality: what a kind of data is, and everything the pipeline does
differently for it, as methods. Callers ask the modality to do the thing (score a batch,
bring a reconstruction into range, augment a client's batch, word a row, choose its view)
rather than asking what the data is and branching; a new kind of data subclasses
`Modality` in one module and registers it (gradleak.modalities).

This package sits below gradleak.data and imports nothing above it: what a modality needs
from higher layers (its scorer, the LPIPS shape rule) it names by "module:function"
reference, imported when called."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, TypeVar

import torch

from ..errors import GradleakError
from ..registry import import_reference

V = TypeVar("V")
V_co = TypeVar("V_co", covariant=True)
# the distances a reconstruction can be re-identified by (gradleak.metrics.reidentify)
ReidDistance = Literal["ssim", "l2", "tokens", "lpips"]


@dataclass(frozen=True)
class Score:
    """One score of a modality's headline, as the report and the terminal print it."""

    key: str  # the metric's name in a row's metrics
    title: str
    unit: str = ""
    digits: int = 2  # significant digits in the report
    spec: str = ".2f"  # format on the terminal


class View(Protocol[V_co]):
    """The ways the report can show a stored result; a modality picks one (`Modality.shown`)."""

    def pictures(self) -> V_co: ...  # a grid of originals over reconstructions

    def text(self) -> V_co: ...  # each original beside its recovery, as text


# the options a dataset spec may set that only some data take (gradleak.data.transforms)
PICTURE_OPTIONS = ("crop", "resize", "channels")


@dataclass(frozen=True)
class Modality:
    """A kind of data. The fields describe it; the methods are what the pipeline does with it.
    The defaults are those of plain feature rows (tabular records): a subclass overrides what
    its data does differently."""

    name: str
    input_dtype: torch.dtype = torch.float32  # what a model reads: floats, or integer token ids
    # how a batch is scored (a "module:function" reference, called by `score`)
    scorer: str = "gradleak.metrics.scoring:score_features"
    # the scores a row is summed up by, headline first (the matrix, the Flower lines, the terminal)
    scores: tuple[Score, ...] = ()
    # when a reconstructed example counts as a copy of its original (ASR, gradleak.metrics)
    copy_criterion: str = "MSE to the original at most 1e-3 (gradleak.metrics.scoring.ASR_MSE_THRESHOLD)"
    # the distance a reconstruction is re-identified by among a gallery (gradleak.metrics.reidentify)
    reid_distance: Literal["ssim", "l2", "tokens"] = "l2"
    # distances that enter the linkage AUC beside re-identification's (docs/judging.md: pictures
    # add pixel correlation, which reads the partial, noise-like reconstructions SSIM and LPIPS miss)
    linkage_extra: tuple[Literal["pearson"], ...] = ()
    # the range a reconstruction is brought into before it is scored (None: as it is)
    value_range: tuple[float, float] | None = None
    # which of two reconstructions is better: these metrics in turn (name, higher is better)
    best_by: tuple[tuple[str, bool], ...] = (("mse", False),)
    # the client-side augmentations (TrainingSpec.augment) that act on this data; others pass it unchanged
    augmentations: tuple[str, ...] = ()
    # the dataset spec options (gradleak.data.transforms) this data takes beyond the common ones
    dataset_options: tuple[str, ...] = ()
    # the metric the report's plots put on their leakage axis: "psnr" (linear dB) or "mse" (log)
    plotted_by: Literal["psnr", "mse"] = "mse"
    # the score the verdict table heads its "best" column with (None: that of pictures)
    table_score: Score | None = None
    # said after a model fails to read this data's inputs (gradleak.models.user.check_model_fits)
    model_hint: str = ""
    # the width of the metric names the terminal lists (`terminal_lines`): the longest one's
    terminal_width: int = 10

    # -- what the data is -------------------------------------------------------------------

    @property
    def headline(self) -> str:
        """The metric a row of this data is judged and plotted by first."""
        return self.scores[0].key

    def example(self, input_shape: tuple[int, ...]) -> torch.Tensor:
        """One all-zero input of `input_shape` (token id 0 for text), to probe a model with."""
        return torch.zeros((1, *input_shape), dtype=self.input_dtype)

    def probe_inputs(self, count: int, input_shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """`count` random inputs of the data's kind, to probe a model's response with: standard
        normal here, for standardised features. The uniform draw is always made first, so a
        generator ends in the same state whatever the data."""
        torch.rand((count, *input_shape), generator=generator)
        return torch.randn((count, *input_shape), generator=generator)

    def picture_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The (C, H, W) layout of one input where the data are pictures (kept in their value
        range and smooth between neighbouring pixels: an attack's box and total-variation
        prior, a picture's scale), else None."""
        return None

    def reads_per_position(self, out: Any, input_shape: tuple[int, ...]) -> bool:
        """Whether a model's output `out` for one input is per-position logits (1, T, K), which
        a language model returns for a sequence of length T, rather than (1, K)."""
        return False

    def refuses(self, attack: Any) -> str | None:
        """Why `attack` does not fit this data (its `modalities` leave it out), or None: the
        one compatibility check between an attack and a modality."""
        return None if self.name in getattr(attack, "modalities", ()) else f"does not handle {self.name} data"

    def check_dataset_options(self, dataset: str, options: dict[str, Any]) -> None:
        """Refuse the dataset spec options in `options` that are set but do not apply to this
        data (`dataset_options`)."""
        refused = [n for n, v in options.items() if v is not None and n not in self.dataset_options]
        if "seq_len" in refused:
            raise GradleakError(f"dataset '{dataset}' is {self.name}: seq_len only applies to text")
        if refused:
            raise GradleakError(f"dataset '{dataset}' is {self.name}: {', '.join(refused)} only apply "
                                "to images")

    # -- what is done with it ----------------------------------------------------------------

    def clamp(self, x: torch.Tensor) -> torch.Tensor:
        """A reconstruction brought into the data's range (`value_range`; without one, as is)."""
        return x.clamp(*self.value_range) if self.value_range is not None else x

    def augmented(self, x: torch.Tensor, augment: tuple[str, ...], padding: int,
                  generator: torch.Generator) -> torch.Tensor:
        """A client's batch under the training's augmentation: unchanged, as no augmentation
        acts on this data."""
        return x

    def score(self, originals: torch.Tensor, labels: torch.Tensor, reconstruction: torch.Tensor,
              recovered_labels: torch.Tensor | None, *, lpips: str, asr_mse: float, gallery: Any,
              tokenizer: str | None) -> tuple[list, torch.Tensor]:
        """Per-example scores of one attacked batch, and the reconstruction reordered to the
        originals (gradleak.metrics.scoring.score_batch), by the modality's `scorer`, called as
        scorer(originals, labels, reconstruction, recovered_labels, modality, lpips=, asr_mse=,
        gallery=): `score_features` and `score_pictures` take any float data."""
        scorer = import_reference(self.scorer)
        return scorer(originals, labels, reconstruction, recovered_labels, self, lpips=lpips, asr_mse=asr_mse,
                      gallery=gallery)

    def reid_distances(self, input_shape: tuple[int, ...], lpips: str) -> tuple[ReidDistance, ...]:
        """The distances a reconstruction is re-identified by among a gallery."""
        return (self.reid_distance,)

    def rank(self, metrics: dict) -> tuple[float, ...]:
        """A sort key of a reconstruction's metrics, lower is better (`best_by`); a missing
        score ranks last."""
        def value(key: str, higher: bool) -> float:
            v = metrics.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return math.inf
            return -v if higher else v
        return tuple(value(key, higher) for key, higher in self.best_by)

    # -- what a result keeps and how it is shown -------------------------------------------

    def record(self, originals: torch.Tensor, reconstructions: torch.Tensor, per_example: list[dict],
               numeric: Callable[[dict], dict], pictures: bool) -> tuple[bytes | None, list[dict], dict]:
        """What the results store keeps of one result beside its metrics: the comparison grid
        as PNG bytes (or None), one entry per example (its numeric scores, and its pictures as
        PNG bytes where there are any and `pictures` asks for them), and extras to add."""
        return None, [{"idx": i, "metrics": numeric(s), "original": None, "reconstruction": None}
                      for i, s in enumerate(per_example)], {}

    def write_files(self, out: Path, originals: torch.Tensor, reconstructions: torch.Tensor,
                    per_example: list[dict], write: Callable[[Path, str], None]) -> dict[str, Path]:
        """The CLI's files beside result.json that show the reconstruction (none here), by name."""
        return {}

    def shown(self, view: View[V]) -> V:
        """How the report shows a stored result of this data: the view's way for it."""
        return view.text()

    def gallery_caption(self, metrics: dict, fmt: Callable[[Any, int], str]) -> str:
        """The scores under a result in the report's gallery."""
        return self.score_words(metrics, fmt)

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

    def round_words(self, row: dict) -> str:
        """One audited update's leakage in the data's own scores (a federation's rounds)."""
        line = self.score_line(row)
        if line is None:
            return f"MSE {row['mse']:.3g}" if row.get("mse") is not None else "no score"
        return line

    def outcome_headline(self, metrics: dict) -> str | None:
        """The headline score that leads an attack's outcome in a few words, or None: feature
        rows have none worth leading with (their copies and re-identifications say it)."""
        return None

    def _headline_words(self, metrics: dict) -> str | None:
        headline = self.scores[0]
        if metrics.get(headline.key) is None:
            return None
        return f"{headline.title} {format(metrics[headline.key], headline.spec)}{headline.unit}"

    def terminal_lines(self, metrics: dict, headline: str, fmt: Callable[[Any], str]) -> list[str]:
        """The metrics of one attack for the terminal, one per line; `headline` is the PSNR
        row (gradleak.commands.attack.psnr_line), said first when nothing was reconstructed."""
        nothing = headline.startswith("nothing reconstructed")
        lines = [f"  {headline}"] if nothing else []  # said first, and no PSNR row
        for key in ("mse", "psnr", "ssim", "lpips", "label_acc", "asr", "iterations"):
            if key != "psnr":
                lines.append(f"  {key:{self.terminal_width}s} {fmt(metrics.get(key))}")
            elif not nothing:
                lines.append(f"  {headline}")
        return lines
