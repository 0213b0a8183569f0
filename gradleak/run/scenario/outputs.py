"""Writing one result: the results store's record (metrics, extras, PNG images or token
sequences) and the CLI's files (result.json, grid.png, sequences.txt)."""
from __future__ import annotations

import json
from pathlib import Path

from ...data.modality import modality
from .spec import AttackRunResult, jsonable


def result_record(result: AttackRunResult, images: bool = True) -> dict:
    """A picklable, JSON-shaped record of one result for the results store:
    metrics, extras (with the attack's convergence report and the auditor's ladder),
    the comparison grid and every image pair as PNG bytes (`images=False`: none). Token
    sequences keep their numeric scores per example and each original beside its recovery
    as text in `extras["sequences"]`."""
    import io

    from ...viz import image_grid

    def png(image) -> bytes:
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue()

    kind = modality(result.modality)
    pictures = images
    images, grid = [], None
    if kind.pixels and pictures:
        grid = png(image_grid([result.originals, result.reconstructions]))
        for i, score in enumerate(result.per_example):
            images.append({"idx": i, "metrics": _numeric(score),
                           "original": png(image_grid([result.originals[i:i + 1]], pad=0)),
                           "reconstruction": png(image_grid([result.reconstructions[i:i + 1]], pad=0))})
    else:
        images = [{"idx": i, "metrics": _numeric(s), "original": None, "reconstruction": None}
                  for i, s in enumerate(result.per_example)]
    extras = jsonable(result.extras)
    if kind.tokens and result.per_example:
        extras["sequences"] = [{"index": s["index"], "original": s.get("original", ""),
                                "recovered": s.get("recovered", ""), "exact": bool(s.get("success"))}
                               for s in result.per_example]
    if result.convergence:
        extras["convergence"] = jsonable(result.convergence)
    # the modality travels with the record, so that the store can keep it beside the row
    return {"metrics": result.metrics, "extras": extras, "seconds": result.seconds,
            "grid_png": grid, "images": images, "modality": result.modality}


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
    from ...viz import save_grid

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "result.json"}
    _write_atomically(paths["json"], json.dumps(result.to_json(), indent=2))
    kind = modality(result.modality)
    if kind.pixels:
        paths["grid"] = out / "grid.png"
        save_grid(paths["grid"], result.originals, result.reconstructions)
    elif kind.tokens and result.per_example:
        paths["sequences"] = out / "sequences.txt"
        _write_atomically(paths["sequences"], sequence_pairs_text(result.per_example))
    return paths


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def sequence_pairs_text(per_example: list[dict]) -> str:
    """Each attacked sequence and what the attack recovered for it, as plain text."""
    blocks = []
    for score in per_example:
        verdict = "exact" if score.get("success") else f"ROUGE-1 {score.get('rouge1', 0.0):.3f}"
        blocks.append(f"#{score['index']} ({verdict})\noriginal:  {score.get('original', '')}\n"
                      f"recovered: {score.get('recovered', '')}\n")
    return "\n".join(blocks)

