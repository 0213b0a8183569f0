"""Helpers that several pipeline benchmarks share (a benchmark imports this module, never another
benchmark): a sweep's verdict as one row, and the examples its sample ladder added
(bench_demo_seeds, bench_fresh_settings)."""
from __future__ import annotations


def seed_row(entry: dict) -> dict:
    return {"setting": f"{entry['threat']} b{entry['batch_size']} {entry['defense']} {entry['strength']}".strip(),
            "verdict": entry["verdict"], "grade": entry["grade"] or ("holds" if entry["verdict"] == "holds" else None),
            "attack": entry.get("grade_attack"),
            "linkage": entry.get("ev_linkage"),
            "linkage_95": [entry.get("ev_linkage_low"), entry.get("ev_linkage_high")],
            "recognizable": entry.get("ev_recognizable"), "recognizable_95": [entry.get("ev_recognizable_low"),
                                                                               entry.get("ev_recognizable_high")],
            "top1": entry.get("ev_identified"), "top1_95": [entry.get("ev_identified_low"),
                                                           entry.get("ev_identified_high")],
            "examples": entry.get("ev_examples"), "min_examples": entry.get("min_examples"),
            "sample_rungs": entry.get("sample_rungs"), "utility_loss": entry.get("utility_loss"),
            "utility_loss_ci": entry.get("utility_loss_ci"), "text": entry["verdict_text"]}


def sample_examples(cells, entry: dict) -> int:
    """Examples per attack that the sample ladder added to a setting (its grading attack's, or
    the most any attack got)."""
    added: dict[str, int] = {}
    for cell in cells:
        labels = cell.labels
        if (cell.kind == "attack" and labels.get("sample_rung") and labels.get("threat") == entry["threat"]
                and labels.get("defense") == entry["defense"] and labels.get("strength") == entry["strength"]
                and labels.get("batch_size") == entry["batch_size"]):
            attack = labels.get("attack_spec") or labels.get("attack")
            added[attack] = added.get(attack, 0) + int(cell.metrics.get("examples") or 0)
    grading = entry.get("grade_attack")
    return added.get(grading, 0) if grading in added else max(added.values(), default=0)
