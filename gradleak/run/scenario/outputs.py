"""Writing one result: the results store's record (metrics, extras, PNG images or token
sequences) and the CLI's files (result.json, grid.png, sequences.txt)."""
from __future__ import annotations

import json
from pathlib import Path

from ...modalities import modality
from .spec import AttackRunResult, jsonable


def result_record(result: AttackRunResult, images: bool = True) -> dict:
    """A picklable, JSON-shaped record of one result for the results store:
    metrics, extras (with the attack's convergence report and the auditor's ladder),
    the comparison grid and every image pair as PNG bytes (`images=False`: none). Token
    sequences keep their numeric scores per example and each original beside its recovery
    as text in `extras["sequences"]`."""
    grid, pairs, kept = modality(result.modality).record(result.originals, result.reconstructions,
                                                          result.per_example, _numeric, images)
    extras = jsonable(result.extras)
    extras.update(kept)
    if result.convergence:
        extras["convergence"] = jsonable(result.convergence)
    # the modality travels with the record, so that the store can keep it beside the row
    return {"metrics": result.metrics, "extras": extras, "seconds": result.seconds,
            "grid_png": grid, "images": pairs, "modality": result.modality}


def _numeric(score: dict) -> dict:
    """The numbers of one example's score, as the store keeps them: a mapping of numbers (the
    rank under each distance) flattened to `gallery_ranks.ssim`-style keys; a language model's
    per-position labels and the decoded texts are kept elsewhere."""
    out = {}
    for k, v in score.items():
        if isinstance(v, dict):
            out.update({f"{k}.{name}": n for name, n in v.items() if n is None or isinstance(n, (int, float))})
        elif v is None or isinstance(v, (int, float)):
            out[k] = v
    return out


def write_outputs(result: AttackRunResult, out: str | Path) -> dict[str, Path]:
    """result.json and, for images, grid.png in `out` (for token sequences, sequences.txt:
    each original beside its recovery), each written atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "result.json"}
    _write_atomically(paths["json"], json.dumps(result.to_json(), indent=2))
    paths.update(modality(result.modality).write_files(out, result.originals, result.reconstructions,
                                                       result.per_example, _write_atomically))
    return paths


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
