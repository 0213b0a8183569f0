"""A static HTML report of a results store: opens from disk, no server, no
external scripts or stylesheets; images are PNG files next to index.html."""
from __future__ import annotations

from pathlib import Path

import jinja2

from ..analysis import (
    HOLDS_MIN_SEEDS,
    attack_rows,
    best_reconstructions,
    dataset_modalities,
    leakage_by_round,
    strongest_attacks,
    study_tables,
)
from ..errors import GradleakError
from ..modalities import stored_modality
from ..store import ResultStore
from .exports import write_exports
from .plots import Figure, plot_rounds, tradeoff_figures
from .summary import summary_tables
from .tables import (
    ATTACK_COLUMNS,
    ROUND_COLUMNS,
    STRONGEST_COLUMNS,
    failed_table,
    make_table,
    skipped_table,
    study_columns,
)
from .views import THUMB_IMAGES, ImageFiles, gallery_groups, matrix_views
from .words import by_threat, threat_title, verdict_sections, with_words

# The page's markup lives in templates/report.html. Autoescaping is on and every value handed to
# the template is plain text, so whatever a store holds (labels, errors, sentences of a text
# dataset) prints as text, never as markup or template code.
_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("gradleak", "templates"), autoescape=True,
                                undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def write_report(store_path: str | Path, out: str | Path, tolerance=None, utility_budget: float | None = None) -> dict:
    """Write index.html, plots, image files and CSV/JSON exports to `out`; the verdicts at
    `tolerance` and the answer within `utility_budget` (default: those the study was run with)."""
    store = ResultStore(store_path, create=False)
    try:
        cells = store.cells()
        if not cells:
            raise GradleakError(f"store '{store_path}' holds no finished cells")
        out = Path(out)
        (out / "images").mkdir(parents=True, exist_ok=True)
        entries = strongest_attacks(cells, tolerance, utility_budget)
        modalities = dataset_modalities(cells)
        rows = [{k: v for k, v in r.items() if k != "evidence"} for r in attack_rows(cells)]
        images = ImageFiles(out, store)
        rounds = leakage_by_round(cells)
        # the round plot reads PSNR: the cells whose data are plotted by it
        pictures = {c.key for c in cells if stored_modality(c.modality).plotted_by == "psnr"}
        gallery = gallery_groups(cells, images)
        page = _TEMPLATES.get_template("report.html").render(
            store_path=str(store_path),
            counts={kind: sum(c.kind == kind for c in cells) for kind in ("attack", "utility", "skipped", "failed")},
            thumb_images=THUMB_IMAGES, holds_min_seeds=HOLDS_MIN_SEEDS,
            verdicts=verdict_sections(entries), summary=summary_tables(entries),
            matrices=matrix_views(best_reconstructions(cells), images),
            strongest=[(threat_title(threat), make_table([with_words(e, full=True) for e in members], STRONGEST_COLUMNS,
                                                      lambda e: "frontier" if e.get("frontier") else ""))
                       for threat, members in by_threat(entries).items()],
            tradeoffs=tradeoff_figures(entries, out),
            rounds=make_table(rounds, ROUND_COLUMNS) if rounds else None,
            rounds_plot=(Figure("rounds.png", "leakage per round")
                         if rounds and plot_rounds(rounds, out / "rounds.png", pictures) else None),
            studies=[(factor, make_table(rows_of, study_columns(factor)))
                     for factor, rows_of in study_tables(cells).items()],
            attacks=make_table(rows, ATTACK_COLUMNS),
            skipped=skipped_table(cells),
            failed=failed_table(cells),
            gallery=gallery)
        (out / "index.html").write_text(page)
        write_exports(out, cells, entries, rows, store)
        return {"out": str(out), "html": str(out / "index.html"), "cells": len(cells),
                "grids": sum(len(group.figures) for group in gallery),
                "texts": sum(len(group.texts) for group in gallery), "strongest": entries,
                "modalities": modalities}
    finally:
        store.close()


