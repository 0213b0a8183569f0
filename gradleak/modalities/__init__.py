"""Every kind of data the pipeline attacks, one module each (image, text, tabular), behind one
contract (base.Modality): the pipeline asks `modality(name)` to do what differs by data and
never compares names or reads a tensor's rank to decide. A new kind of data is one module
that subclasses `Modality`, registered here in MODALITIES, by `MODALITIES.register(name, record)`
at run time, or through the entry point group `gradleak.modalities` of an installed package;
its record's `scorer` names its batch scorer."""
from __future__ import annotations

from typing import Iterable

from ..registry import Registry
from .base import PICTURE_OPTIONS, Modality, Score, View
from .image import PSNR as PICTURES_SCORE

__all__ = ["MODALITIES", "Modality", "Score", "View", "PICTURE_OPTIONS", "modality", "stored_modality",
           "table_score"]

# name → the modality's record (an instance of a `Modality` subclass)
MODALITIES: Registry[Modality] = Registry("modality", {
    "image": "gradleak.modalities.image:IMAGE",
    "tabular": "gradleak.modalities.tabular:TABULAR",
    "text": "gradleak.modalities.text:TEXT",
}, group="gradleak.modalities")


def modality(name: str) -> Modality:
    """The record of a modality by name ("image", "tabular", "text", or one registered)."""
    return MODALITIES.get(name)


def stored_modality(name: str | None) -> Modality:
    """The record of a store row's modality; a row that records none (and has no evidence for
    the legacy rule) is summed up by its MSE, as tabular records are."""
    return MODALITIES.get(name) if isinstance(name, str) and name in MODALITIES else MODALITIES.get("tabular")


def table_score(kinds: Iterable[Modality]) -> Score:
    """The score a table of rows of these modalities heads its "best" column with: the one
    they all share, else that of pictures (feature rows share none: their column stays empty)."""
    shared = {kind.table_score for kind in kinds}
    score = shared.pop() if len(shared) == 1 else None
    return score or PICTURES_SCORE
