"""The report's tables: rows of plain-text cells built from dicts and a list of columns."""
from __future__ import annotations

from dataclasses import dataclass

from .words import fmt


@dataclass
class TableCell:
    text: str
    left: bool  # text aligns left, numbers right


@dataclass
class TableRow:
    cells: list[TableCell]
    css_class: str = ""


@dataclass
class Table:
    titles: list[str]
    rows: list[TableRow]


# columns of one modality's scores, left out of a table where no row has a value
# shown only where some row has them: text scores, and a DP defense's ε and bound
OPTIONAL_COLUMNS = frozenset({"rouge1", "best_rouge1", "rouge2", "best_rouge2", "epsilon", "rero_text"})


def make_table(rows: list[dict], columns: list[tuple[str, str]], row_class=None) -> Table:
    columns = [(k, t) for k, t in columns if k not in OPTIONAL_COLUMNS or any(r.get(k) is not None for r in rows)]
    return Table([title for _, title in columns],
                 [TableRow([TableCell(fmt(r.get(k)), isinstance(r.get(k), str)) for k, _ in columns],
                           row_class(r) if row_class else "") for r in rows])


STRONGEST_COLUMNS = [("dataset", "dataset"), ("model", "model"), ("batch_size", "batch"),
                     ("local_steps", "local steps"), ("defense", "defense"), ("strength", "strength"),
                     ("verdict", "verdict"), ("verdict_text", "in words"), ("seeds", "seeds"),
                     ("utility", "utility"), ("utility_loss", "utility loss"), ("utility_loss_ci", "±"),
                     ("utility_model", "utility trained on"),
                     ("grade_text", "grade"), ("epsilon", "DP ε"), ("rero_text", "ReRo bound"),
                     ("linkage_text", "linkage AUC"),
                     ("recognizable_text", "recognizable"), ("evidence_text", "examples"),
                     ("reid_text", "re-identified"), ("budget_text", "budget"),
                     ("mse", "best MSE"), ("best_mse", "by"), ("psnr", "best PSNR"), ("psnr_ci", "±"),
                     ("best_psnr", "by"), ("ssim", "best SSIM"), ("ssim_ci", "±"), ("best_ssim", "by"),
                     ("lpips", "best LPIPS"), ("best_lpips", "by"), ("asr", "best ASR"), ("best_asr", "by"),
                     ("rouge1", "best ROUGE-1"), ("best_rouge1", "by"), ("rouge2", "best ROUGE-2"),
                     ("best_rouge2", "by"),
                     ("frontier", "frontier"), ("utility_note", "caveat")]
ROUND_COLUMNS = [("round", "round"), ("client", "client"), ("attack", "attack"), ("mse", "MSE"), ("psnr", "PSNR"),
                 ("ssim", "SSIM"), ("lpips", "LPIPS"), ("asr", "ASR"), ("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2")]
ATTACK_COLUMNS = [("attack_spec", "attack"), ("dataset", "dataset"), ("batch_size", "batch"),
                  ("local_steps", "local steps"), ("defense", "defense"), ("strength", "strength"),
                  *[(m, m.upper()) for m in ("mse", "psnr", "ssim", "lpips", "label_acc", "asr", "iterations")],
                  ("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"),
                  ("seconds", "seconds")]
SKIPPED_COLUMNS = [("attack", "attack"), ("model", "model"), ("defense", "defense"), ("reason", "reason")]
FAILED_COLUMNS = [("kind", "cell"), ("what", "attack"), ("dataset", "dataset"), ("model", "model"),
                  ("defense", "defense"), ("batch", "batch"), ("error", "error")]


def study_columns(factor: str) -> list[tuple[str, str]]:
    return [("threat", "threat"), ("dataset", "dataset"), ("model", "model"), ("attack", "attack"),
            (factor, factor), ("asr", "ASR"), ("iterations", "iterations"), ("psnr", "PSNR"), ("cells", "cells")]


def skipped_table(cells) -> Table | None:
    skipped = [{"attack": c.labels.get("attack_spec"), "model": c.labels.get("model"),
                "defense": c.labels.get("defense"), "reason": c.labels.get("reason")}
               for c in cells if c.kind == "skipped"]
    return make_table(skipped, SKIPPED_COLUMNS) if skipped else None


def failed_table(cells) -> Table | None:
    failed = [{"kind": c.labels.get("cell_kind"), "what": c.labels.get("attack_spec"),
               "dataset": c.labels.get("dataset"), "model": c.labels.get("model"),
               "defense": c.labels.get("defense"), "batch": c.labels.get("batch_size"),
               "error": c.extras.get("error") if isinstance(c.extras, dict) else None}
              for c in cells if c.kind == "failed"]
    return make_table(failed, FAILED_COLUMNS) if failed else None


