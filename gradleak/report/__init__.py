"""The report of a results store, by job: `words` (the verdicts in sentences, also printed by
the command line), `summary` (the first screen's table per scenario), `tables`, `plots`, `views`
(the matrix and the gallery), `html` (the page) and `exports` (CSV and JSON)."""
from __future__ import annotations

from .html import write_report
from .views import TextPair, text_pairs
from .words import VerdictSection, format_strongest, verdict_in_words, verdict_sections

__all__ = ["TextPair", "VerdictSection", "format_strongest", "text_pairs", "verdict_in_words", "verdict_sections",
           "write_report"]
