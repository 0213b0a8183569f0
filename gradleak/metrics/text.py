"""Scoring a recovered batch of token sequences against the client's batch.

As for images, batch order is not identifiable from an update: recovered sequences are first
assigned to originals by the Hungarian algorithm (scipy's linear_sum_assignment), maximising
either the summed ROUGE-1 F-measure of the decoded texts (default) or the summed token
agreement (the fraction of positions holding the same token id), and only then scored:

* `rouge1`, `rouge2`, `rougeL`: mean ROUGE F-measures over the matched pairs, computed by
  Google's rouge-score package on the decoded texts (right padding dropped) with its default
  tokenizer (lower-cased runs of ASCII letters and digits) and no stemming, the setting DAGER
  and LAMP report;
* `token_accuracy`: the fraction of the originals' non-padding positions whose matched
  sequence holds the same token id at the same position;
* `exact_sequence_accuracy`: the fraction of originals recovered token for token.

rouge-score imports nltk (for its optional Porter stemmer, about 1.5 s at first import, no
data download); it is imported only when a score is computed.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ..data.text import PAD_TOKEN, decode, pad_token_of
from .reidentify import Gallery, chance_rate, judge, reid_summary

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")
# Perceptual bar of `recognizable` for text: a recovery re-identified among the gallery that
# shares at least this ROUGE-1 F-measure with its original (calibrated on the gensim news
# windows: docs/judging.md).
RECOGNIZABLE_ROUGE1 = 0.5


@functools.lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=False)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures of one prediction against one reference."""
    scores = _scorer().score(reference, prediction)
    return {key: float(scores[key].fmeasure) for key in ROUGE_KEYS}


@dataclass
class TextScore:
    rouge1: float
    rouge2: float
    rougeL: float  # the name ROUGE reports use
    token_accuracy: float
    exact_sequence_accuracy: float
    # assignment[i]: the recovered row matched to original i
    assignment: list[int]
    per_sequence: list[dict[str, float]]  # the same scores for each original

    def to_dict(self) -> dict:
        """JSON form: the five headline scores, the assignment and the per-sequence scores."""
        return {"rouge1": self.rouge1, "rouge2": self.rouge2, "rougeL": self.rougeL,
                "token_accuracy": self.token_accuracy, "exact_sequence_accuracy": self.exact_sequence_accuracy,
                "assignment": list(self.assignment), "per_sequence": [dict(s) for s in self.per_sequence]}


def _token_agreement(originals: torch.Tensor, recovered: torch.Tensor, pad_token: int | None) -> np.ndarray:
    """(originals × recovered) fraction of each original's non-pad positions that agree."""
    same = (originals[:, None, :] == recovered[None, :, :]).double()
    counted = torch.ones_like(originals, dtype=torch.float64)
    if pad_token is not None:
        counted = _content_mask(originals, pad_token).double()
    return ((same * counted[:, None, :]).sum(-1) / counted.sum(-1, keepdim=True).clamp_min(1)).numpy()


def _content_mask(tokens: torch.Tensor, pad_token: int) -> torch.Tensor:
    """True at every position before a row's trailing run of padding."""
    is_pad = tokens == pad_token
    trailing = is_pad.flip(-1).long().cumprod(-1).flip(-1).bool()
    return ~trailing


def score_text(originals: torch.Tensor, recovered: torch.Tensor, pad_token: int | None = PAD_TOKEN,
               match_on: Literal["rouge1", "tokens"] = "rouge1", tokenizer: str | None = "gpt2") -> TextScore:
    """Match `recovered` (M, T) token rows to `originals` (B, T) and score them (see module doc).

    An original left without a match (M < B) scores 0 everywhere. `pad_token` (default
    `<|endoftext|>`) marks right padding, dropped before decoding and not counted in token
    accuracy; None counts every position. `tokenizer` decodes the ids for ROUGE
    (gradleak.data.text.decode).
    """
    if originals.dim() != 2 or recovered.dim() != 2 or originals.shape[1] != recovered.shape[1]:
        raise ValueError(f"score_text needs (B, T) and (M, T) token ids; got {tuple(originals.shape)} "
                         f"and {tuple(recovered.shape)}")
    originals, recovered = originals.detach().cpu().long(), recovered.detach().cpu().long()
    texts_o = [decode(row, pad_token, tokenizer) for row in originals]
    texts_r = [decode(row, pad_token, tokenizer) for row in recovered]
    agreement = _token_agreement(originals, recovered, pad_token)
    pair_rouge = [[rouge(r, o) for r in texts_r] for o in texts_o]
    if match_on == "rouge1":
        gain = np.array([[pair["rouge1"] for pair in row] for row in pair_rouge]) + 1e-6 * agreement
    elif match_on == "tokens":
        gain = agreement + 1e-6 * np.array([[pair["rouge1"] for pair in row] for row in pair_rouge])
    else:
        raise ValueError(f"match_on must be rouge1 or tokens, got {match_on!r}")
    rows, cols = linear_sum_assignment(-gain)
    assignment = [-1] * originals.shape[0]
    for r, c in zip(rows, cols):
        assignment[int(r)] = int(c)
    per_sequence = []
    for i, j in enumerate(assignment):
        if j < 0:
            per_sequence.append({**{k: 0.0 for k in ROUGE_KEYS}, "token_accuracy": 0.0, "exact": 0.0})
            continue
        exact = float(torch.equal(originals[i], recovered[j]))
        per_sequence.append({**pair_rouge[i][j], "token_accuracy": float(agreement[i, j]), "exact": exact})

    def mean(key: str) -> float:
        return float(np.mean([s[key] for s in per_sequence])) if per_sequence else 0.0

    return TextScore(mean("rouge1"), mean("rouge2"), mean("rougeL"), mean("token_accuracy"), mean("exact"),
                     assignment, per_sequence)


@dataclass
class SequenceScore:
    """One attacked sequence, scored against its matched recovery (the text counterpart of
    `scoring.ExampleScore`, with the fields the auditor's ladder and summaries read)."""

    index: int  # position of the original in the attacked batch
    label: int | list[int]  # its class, or the next token at each position (a language model's targets)
    recovered_label: int | None
    rouge1: float
    rouge2: float
    rougeL: float
    token_accuracy: float
    success: bool  # recovered token for token: the text form of ASR's "copied"
    matched: bool = True  # False: the attack returned no sequence for this example
    original: str = ""
    recovered: str = ""
    # gallery sequences at least as close (by token overlap) to the recovery as its original
    # (0: re-identified; gradleak.metrics.reidentify); None without a gallery
    gallery_rank: int | None = None
    gallery_size: int | None = None
    reid_chance: float | None = None
    gallery_ranks: dict[str, int] | None = None  # the rank under each distance ({"tokens": 0})
    # linkage AUC in [0, 1]: the fraction of gallery sequences strictly farther from the recovery
    # than its original (ties half); 0.5 for a recovery that carries nothing
    linkage: float | None = None
    # re-identified and ROUGE-1 at least RECOGNIZABLE_ROUGE1; None without a gallery
    recognizable: bool | None = None

    @property
    def identified(self) -> bool | None:
        return None if self.gallery_rank is None else self.gallery_rank == 0

    def to_dict(self) -> dict:
        return {**asdict(self), "identified": self.identified}


def score_sequences(originals: torch.Tensor, labels: torch.Tensor, recovered: torch.Tensor,
                    recovered_labels: torch.Tensor | None, tokenizer: str | None = "gpt2",
                    gallery: Gallery | None = None) -> tuple[list[SequenceScore], torch.Tensor]:
    """Per-sequence scores of one attacked batch after matching (`score_text`), and the
    recovery reordered to the originals (padding rows where nothing matched); with a
    `gallery`, whether each recovery re-identifies its original among it (token overlap).
    `tokenizer` names the vocabulary (its padding and its text; None: unknown ids)."""
    pad_token = pad_token_of(tokenizer)
    originals = originals.detach().cpu().long()
    recovered = recovered.detach().cpu().long()
    matched_scores = score_text(originals, recovered, pad_token, tokenizer=tokenizer)
    aligned = torch.full_like(originals, PAD_TOKEN if pad_token is None else pad_token)
    scores = []
    for i, (j, per) in enumerate(zip(matched_scores.assignment, matched_scores.per_sequence)):
        if j >= 0:
            aligned[i] = recovered[j]
        label = labels[i].tolist()
        scores.append(SequenceScore(index=i, label=label, recovered_label=None, rouge1=per["rouge1"],
                                    rouge2=per["rouge2"], rougeL=per["rougeL"],
                                    token_accuracy=per["token_accuracy"], success=bool(per["exact"]),
                                    matched=j >= 0, original=decode(originals[i], pad_token, tokenizer),
                                    recovered=decode(recovered[j], pad_token, tokenizer) if j >= 0 else ""))
    if recovered_labels is not None and labels.dim() == 1:
        pool = [int(v) for v in recovered_labels]
        for s in scores:  # as for images: a label counts when its class is still in the recovered multiset
            s.recovered_label = s.label if s.label in pool else (pool[0] if pool else None)
            if s.recovered_label in pool:
                pool.remove(s.recovered_label)
    if gallery is not None:
        if len(recovered) > 1:  # matched with the ground truth: the gallery gets the same choice
            from .candidate_set import judge_candidates

            verdict = judge_candidates(originals, recovered, gallery, ("tokens",), pad_token=pad_token)
        else:
            verdict = judge(originals, aligned, gallery, ("tokens",), pad_token=pad_token)
        for s, rank, ranks, linkage in zip(scores, verdict.rank, verdict.ranks, verdict.linkage):
            s.gallery_size, s.reid_chance = len(gallery), chance_rate(len(gallery), 1)
            if s.matched:
                s.gallery_rank, s.gallery_ranks, s.linkage = rank, ranks, linkage
            else:  # nothing returned: identifies nothing, links as chance does
                s.gallery_rank, s.gallery_ranks = len(gallery), {"tokens": len(gallery)}
                s.linkage = 0.5 if len(gallery) else None
            s.recognizable = bool(s.identified) and s.matched and s.rouge1 >= RECOGNIZABLE_ROUGE1
    return scores, aligned


def summarize_sequences(scores: list[SequenceScore]) -> dict:
    """Aggregates over all attacked sequences, with the CLI's key names: `rouge1`, `rouge2`,
    `rougeL`, `token_accuracy`, `exact_sequence_accuracy` (means), `asr` (the fraction
    recovered exactly), `label_acc` (None when the attack recovers no labels), `matched`,
    `examples`. Image metrics (MSE, PSNR, SSIM, LPIPS) do not apply and are absent."""
    n = len(scores)

    def avg(key: str) -> float | None:
        return float(np.mean([getattr(s, key) for s in scores])) if scores else None

    labelled = [s for s in scores if s.recovered_label is not None]
    exact = sum(s.success for s in scores) / n if n else None
    return {"rouge1": avg("rouge1"), "rouge2": avg("rouge2"), "rougeL": avg("rougeL"),
            "token_accuracy": avg("token_accuracy"), "exact_sequence_accuracy": exact,
            "label_acc": (sum(s.recovered_label == s.label for s in labelled) / len(labelled)) if labelled else None,
            "asr": exact, "matched": sum(s.matched for s in scores) / n if n else None, "examples": n,
            **reid_summary(scores)}
