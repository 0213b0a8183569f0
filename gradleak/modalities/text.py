"""Text: integer token ids, a sequence of length T per example, read by language models
(per-position next-token logits). Scored by ROUGE and exact match, re-identified by token
overlap, kept and shown as each original sequence beside its recovery."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..registry import import_reference
from .base import Modality, Score, V, View

# the metrics of one attack the terminal lists for token sequences, in order
TERMINAL_KEYS = ("rouge1", "rouge2", "rougeL", "token_accuracy", "exact_sequence_accuracy", "label_acc")


@dataclass(frozen=True)
class Text(Modality):
    def probe_inputs(self, count: int, input_shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """`count` uniform draws in [0, 1], a stand-in for bounded inputs (ids are probed elsewhere)."""
        return torch.rand((count, *input_shape), generator=generator)

    def reads_per_position(self, out: Any, input_shape: tuple[int, ...]) -> bool:
        return isinstance(out, torch.Tensor) and out.dim() == 3 and tuple(out.shape[:2]) == (1, *input_shape)

    def score(self, originals: torch.Tensor, labels: torch.Tensor, reconstruction: torch.Tensor,
              recovered_labels: torch.Tensor | None, *, lpips: str, asr_mse: float, gallery: Any,
              tokenizer: str | None) -> tuple[list, torch.Tensor]:
        """Sequences matched and scored by ROUGE (gradleak.metrics.text.score_sequences): the
        vocabulary decides padding and the words shown; pixel options do not apply."""
        scorer = import_reference(self.scorer)
        return scorer(originals, labels, reconstruction, recovered_labels, tokenizer=tokenizer, gallery=gallery)

    def record(self, originals: torch.Tensor, reconstructions: torch.Tensor, per_example: list[dict],
               numeric: Callable[[dict], dict], pictures: bool) -> tuple[bytes | None, list[dict], dict]:
        """No pictures; each original beside its recovery as text in `extras["sequences"]`."""
        grid, images, _ = super().record(originals, reconstructions, per_example, numeric, pictures)
        if not per_example:
            return grid, images, {}
        return grid, images, {"sequences": [{"index": s["index"], "original": s.get("original", ""),
                                             "recovered": s.get("recovered", ""), "exact": bool(s.get("success"))}
                                            for s in per_example]}

    def write_files(self, out: Path, originals: torch.Tensor, reconstructions: torch.Tensor,
                    per_example: list[dict], write: Callable[[Path, str], None]) -> dict[str, Path]:
        """sequences.txt: each original beside its recovery."""
        if not per_example:
            return {}
        write(out / "sequences.txt", sequence_pairs_text(per_example))
        return {"sequences": out / "sequences.txt"}

    def shown(self, view: View[V]) -> V:
        return view.text()

    def round_words(self, row: dict) -> str:
        """The headline scores with the share of sequences recovered exactly."""
        line = self.score_line(row)
        if line is None:
            return super().round_words(row)
        return f"{line}  exact {row.get('asr') or 0:.0%}"

    def outcome_headline(self, metrics: dict) -> str | None:
        return self._headline_words(metrics)

    def terminal_lines(self, metrics: dict, headline: str, fmt: Callable[[Any], str]) -> list[str]:
        """Sequence scores only: no pixel metrics."""
        return [f"  {key:{self.terminal_width}s} {fmt(metrics.get(key))}" for key in TERMINAL_KEYS]


def sequence_pairs_text(per_example: list[dict]) -> str:
    """Each attacked sequence and what the attack recovered for it, as plain text."""
    blocks = []
    for score in per_example:
        verdict = "exact" if score.get("success") else f"ROUGE-1 {score.get('rouge1', 0.0):.3f}"
        blocks.append(f"#{score['index']} ({verdict})\noriginal:  {score.get('original', '')}\n"
                      f"recovered: {score.get('recovered', '')}\n")
    return "\n".join(blocks)


ROUGE1 = Score("rouge1", "ROUGE-1")

TEXT = Text("text", torch.int64, scorer="gradleak.metrics.text:score_sequences",
            scores=(ROUGE1, Score("rouge2", "ROUGE-2")),
            copy_criterion="the sequence recovered token for token", reid_distance="tokens",
            best_by=(("rouge1", True),), dataset_options=("seq_len",), table_score=ROUGE1, terminal_width=24,
            model_hint=" (the data is integer token ids: use a text model such as gpt2)")
