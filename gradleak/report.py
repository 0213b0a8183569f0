"""A static HTML report of a results store: opens from disk, no server, no
external scripts or stylesheets; images are PNG files next to index.html."""
from __future__ import annotations

import csv
import hashlib
import html
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from .analysis import (
    HOLDS_MIN_SEEDS,
    SCENARIO_KEYS,
    answer,
    attack_rows,
    best_reconstructions,
    budget_range,
    cell_ladder,
    leakage_by_round,
    percent,
    setting_name,
    strongest_attacks,
    study_tables,
)
from .errors import GradleakError
from .store import ResultStore
from .viz import pairs_thumbnail

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f0f0f0} td.l,th.l{text-align:left}
tr.frontier td{background:#eaf6ea}
figure{display:inline-block;margin:6px;vertical-align:top;font-size:12px;max-width:360px}
figure img{image-rendering:pixelated;border:1px solid #ddd;max-width:340px}
figure.plot{max-width:none} figure.plot img{max-width:660px;image-rendering:auto}
.note{color:#666;font-size:13px}
table.matrix td,table.matrix th{text-align:center;vertical-align:top;font-size:12px}
table.matrix th.l{text-align:left} table.matrix tr.group th{background:#fafafa;text-align:left}
img.thumb{image-rendering:pixelated;max-width:200px;max-height:110px;border:1px solid #ddd;display:block;
margin:0 auto 2px}
td.empty{color:#999;font-style:italic;max-width:200px} .warn{color:#a60}
details{margin:.4em 0} summary{cursor:pointer;font-weight:600}
ul.answer li{font-weight:600;margin:.3em 0} div.scroll{overflow-x:auto;max-width:100%}
"""

# Counts loaded and broken images and script errors into the title, so a headless
# browser (and the test) can check the page rendered completely.
_CHECK_SCRIPT = """
window.__errors=0;window.addEventListener('error',function(e){if(!(e.target&&e.target.tagName==='IMG')){window.__errors++;}},true);
window.addEventListener('load',function(){var ok=0,bad=0;var imgs=document.images;
for(var i=0;i<imgs.length;i++){if(imgs[i].complete&&imgs[i].naturalWidth>0){ok++;}else{bad++;}}
var thumbs=document.querySelectorAll('img.thumb'),tok=0;
for(var j=0;j<thumbs.length;j++){if(thumbs[j].complete&&thumbs[j].naturalWidth>0){tok++;}}
document.title=document.title+' [images ok='+ok+' broken='+bad+' errors='+window.__errors
+' matrix='+tok+'/'+thumbs.length+']';});
"""


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _table(rows: list[dict], columns: list[tuple[str, str]], row_class=None) -> str:
    head = "".join(f"<th class='l'>{html.escape(t)}</th>" if i < 1 else f"<th>{html.escape(t)}</th>"
                   for i, (_, t) in enumerate(columns))
    body = []
    for r in rows:
        cls = f" class='{row_class(r)}'" if row_class and row_class(r) else ""
        cells = "".join(f"<td class='l'>{html.escape(_fmt(r.get(k)))}</td>" if isinstance(r.get(k), str)
                        else f"<td>{html.escape(_fmt(r.get(k)))}</td>" for k, _ in columns)
        body.append(f"<tr{cls}>{cells}</tr>")
    # a wide table scrolls inside its own box; the page keeps its width
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(body)}</table></div>"


STRONGEST_COLUMNS = [("dataset", "dataset"), ("model", "model"), ("batch_size", "batch"),
                     ("local_steps", "local steps"), ("defense", "defense"), ("strength", "strength"),
                     ("verdict", "verdict"), ("verdict_text", "in words"), ("seeds", "seeds"),
                     ("utility", "utility"), ("utility_loss", "utility loss"), ("utility_loss_ci", "±"),
                     ("utility_model", "utility trained on"),
                     ("reid_text", "re-identified"), ("budget_text", "budget"),
                     ("mse", "best MSE"), ("best_mse", "by"), ("psnr", "best PSNR"), ("psnr_ci", "±"),
                     ("best_psnr", "by"), ("ssim", "best SSIM"), ("ssim_ci", "±"), ("best_ssim", "by"),
                     ("lpips", "best LPIPS"), ("best_lpips", "by"), ("asr", "best ASR"), ("best_asr", "by"),
                     ("frontier", "frontier"), ("utility_note", "caveat")]
THREAT_TITLES = {"honest": "Honest-but-curious server", "informed": "Informed server (labels, BN statistics, "
                 "data distribution)", "malicious": "Malicious server (may modify the model it sends)"}


def _threat_title(threat: str) -> str:
    preset, _, extra = str(threat).partition("+")
    title = THREAT_TITLES.get(preset, f"Threat model '{threat}'")
    return f"{title}, also knowing {extra.replace('+', ', ')}" if extra else title


def _by_threat(entries: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        groups[str(e.get("threat"))].append(e)
    order = list(THREAT_TITLES)
    return dict(sorted(groups.items(), key=lambda kv: (order.index(kv[0].split("+")[0])
                                                       if kv[0].split("+")[0] in order else len(order), kv[0])))


def _scenario_words(e: dict) -> str:
    return (f"{e.get('dataset')}/{e.get('model')}, batch {e.get('batch_size')}, "
            f"{e.get('local_steps')} local step(s)")


@dataclass
class VerdictSection:
    """The verdict of one threat model in words: the answer per scenario first, then one
    sentence per defense setting, then notes (what stays undecided, unknown utility costs,
    the re-identification gallery)."""

    title: str
    answers: list[str]
    settings: list[str]
    notes: list[str]


def verdict_sections(entries: list[dict]) -> list[VerdictSection]:
    out = []
    answers = answer(entries)
    for threat, members in _by_threat(entries).items():
        section = VerdictSection(_threat_title(threat),
                                 [f"{_scenario_words(a)}: {a['text']}." for a in answers if str(a["threat"]) == threat],
                                 [f"{setting_name(e)} ({_scenario_words(e)}): {e['verdict_text']}." for e in members],
                                 [])
        hidden = [e for e in members if str(e.get("verdict", "")).startswith("not shown")]
        if hidden:
            section.notes.append(f"Undecided: {len(hidden)} of {len(members)} settings (reasons above).")
        notes = sorted({f"{e.get('dataset')}/{e.get('model')}: {e['utility_note']}" for e in members
                        if e.get("utility_note")})
        if notes:
            section.notes.append("Utility cost unknown — " + "; ".join(notes) + ": no defense's cost is measured, "
                                 "so none is shown to be free.")
        galleries = sorted({str(e["gallery_note"]) for e in members if e.get("gallery_note")})
        if galleries:
            section.notes.append("Re-identified among: " + "; ".join(galleries) + ".")
        out.append(section)
    return out


def verdict_in_words(entries: list[dict]) -> list[tuple[str, list[str]]]:
    """Per threat model, its verdict as lines: the answers, the settings' sentences, the notes."""
    return [(s.title, s.answers + s.settings + s.notes) for s in verdict_sections(entries)]


def _with_words(entry: dict, full: bool = False) -> dict:
    """The entry with its re-identification and budget in words; `full` adds the rate's 95%
    interval and the gallery it was measured among (the report's table)."""
    reid = None
    if entry.get("identified") is not None:
        chance = f"chance {percent(entry.get('reid_chance') or 0)}"
        if full and entry.get("reid_low") is not None:
            chance = (f"95% interval {100 * entry['reid_low']:.3g}–{100 * entry['reid_high']:.3g}%, {chance}"
                      + (f"; among {entry['gallery_note']}" if entry.get("gallery_note") else ""))
        reid = f"{entry['identified']} of {entry['identified_of']} ({chance})"
    return {**entry, "reid_text": reid, "budget_text": budget_range(entry)}


def format_strongest(entries: list[dict]) -> str:
    """The verdicts for the terminal: per threat model the answer, then a table of the
    strongest attack per setting with its verdict in words."""
    cols = [("batch_size", "B"), ("local_steps", "T"), ("defense", "defense"), ("strength", "strength"),
            ("utility_loss", "util.loss"), ("psnr", "best PSNR"), ("best_psnr", "by"), ("reid_text", "re-identified"),
            ("budget_text", "budget"), ("verdict_text", "verdict")]
    blocks = []
    answers = answer(entries)
    for threat, members in _by_threat(entries).items():
        head = [_threat_title(threat)] + [f"  {_scenario_words(a)}: {a['text']}" for a in answers
                                          if str(a["threat"]) == threat]
        rows = [[_fmt(e.get(k), 3) for k, _ in cols] for e in map(_with_words, members)]
        widths = [max(len(t), *(len(r[i]) for r in rows)) for i, (_, t) in enumerate(cols)]
        line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
        blocks.append("\n".join(head + [line([t for _, t in cols])] + [line(r) for r in rows]))
    for note in sorted({f"{e.get('dataset')}/{e.get('model')}: {e['utility_note']}" for e in entries
                        if e.get("utility_note")}):
        blocks.append(f"util.loss – : {note}; no utility cost is shown")
    return "\n\n".join(blocks)


def _scenario_title(key: tuple) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in zip(SCENARIO_KEYS, key))


def _rounds_plot(rows: list[dict], path: Path) -> bool:
    """PSNR of each attack per server round (mean over audited clients)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_attack: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("psnr") is not None:
            by_attack[str(r["attack"])][r["round"]].append(r["psnr"])
    if not by_attack:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for attack, per_round in sorted(by_attack.items()):
        xs = sorted(per_round)
        ax.plot(xs, [sum(per_round[x]) / len(per_round[x]) for x in xs], marker="o", label=attack)
    ax.set_xlabel("server round")
    ax.set_ylabel("PSNR of the reconstruction (dB)")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# Below this MSE (PSNR 60 dB) a reconstruction is an exact copy; analytic attacks reach 1e-16,
# which would stretch the axis over decades (or hundreds of dB) that say nothing.
PLOT_MSE_FLOOR = 1e-6
PLOT_PSNR_CAP = 60.0


def _tradeoff_plot(entries: list[dict], path: Path, title: str) -> bool:
    """Utility loss (x) against the best attack's PSNR (y, dB, linear: higher = more leaked);
    stores without PSNR (tabular data) fall back to the best MSE on a log axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [e for e in entries if e.get("mse") is not None or e.get("psnr") is not None]
    if not points:
        return False
    by_psnr = all(e.get("psnr") is not None for e in points)

    def privacy(e: dict) -> float:
        if by_psnr:
            return min(e["psnr"], PLOT_PSNR_CAP)
        return max(e["mse"], PLOT_MSE_FLOOR) if e.get("mse") is not None else math.nan

    with_utility = all(e.get("utility_loss") is not None for e in points)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    by_defense: dict[str, list[dict]] = defaultdict(list)
    for e in points:
        by_defense[e["defense"]].append(e)
    for i, (defense, members) in enumerate(sorted(by_defense.items())):
        xs = [e["utility_loss"] if with_utility else i for e in members]
        ys = [privacy(e) for e in members]
        ax.scatter(xs, ys, label=defense, s=36)
        for x, y, e in zip(xs, ys, members):
            if e["strength"]:
                ax.annotate(e["strength"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    frontier = sorted((e for e in points if e.get("frontier")), key=lambda e: e["utility_loss"])
    if with_utility and len(frontier) > 1:
        ax.plot([e["utility_loss"] for e in frontier], [privacy(e) for e in frontier], "k--", lw=0.8,
                label="frontier")
    if not with_utility:
        ax.set_xticks(range(len(by_defense)), sorted(by_defense), rotation=30, fontsize=8)
    ax.set_xlabel(f"utility loss ({points[0].get('utility_metric')})" if with_utility
                  else "defense (utility unknown: the utility model did not train)"
                  if any(e.get("utility_note") for e in points) else "defense (no utility runs in this store)")
    if by_psnr:
        ax.set_ylabel(f"best-attack PSNR, dB (higher = more leaked; ≤ {PLOT_PSNR_CAP:g})")
    else:
        ax.set_ylabel(f"best-attack MSE (higher = more private; exact copies at {PLOT_MSE_FLOOR:g})")
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# A batch wider than this is shown in the matrix by its first THUMB_IMAGES pairs.
THUMB_IMAGES = 8


class _Images:
    """Writes each image file of the report once, under a name derived from the cell key,
    never the key itself: a foreign store's key could hold markup or a path ("../")."""

    def __init__(self, out: Path, store: ResultStore):
        self.out, self.store = out, store
        self.written: dict[str, str] = {}

    def _name(self, text: str) -> str:
        return f"images/{hashlib.sha256(text.encode()).hexdigest()[:32]}.png"

    def grid(self, cell) -> str | None:
        if cell.grid_png is None:
            return None
        name = self._name(cell.key)
        if name not in self.written:
            (self.out / name).write_bytes(cell.grid_png)
            self.written[name] = cell.key
        return name

    def thumb(self, cell) -> str | None:
        batch = cell.labels.get("batch_size")
        if cell.grid_png is not None and isinstance(batch, int) and batch > THUMB_IMAGES:
            name = self._name(cell.key + "#thumb")
            if name in self.written:
                return name
            pairs = [(im.original_png, im.reconstruction_png) for im in self.store.images(cell.key)
                     if im.original_png and im.reconstruction_png]
            try:
                png = pairs_thumbnail(pairs, THUMB_IMAGES) if pairs else None
            except (ValueError, RuntimeError, OSError):  # unreadable or mismatched images: the full grid
                png = None
            if png is not None:
                (self.out / name).write_bytes(png)
                self.written[name] = cell.key
                return name
        return self.grid(cell)


def _matrix_cell(slot: dict | None, images: _Images) -> str:
    if slot is None:
        return "<td class='empty'>not in the sweep</td>"
    best = slot["best"]
    if best is None:
        if slot["not_run"]:
            return f"<td class='empty'>not run: {html.escape(slot['not_run'])}</td>"
        error = slot["failed"][0] if slot["failed"] else "no result"
        error = error if len(error) <= 160 else error[:157] + "…"
        return f"<td class='empty'>failed: {html.escape(error)}</td>"
    m, lab = best.metrics, best.labels
    if m.get("psnr") is not None:
        score = f"PSNR {_fmt(m.get('psnr'), 3)} dB · SSIM {_fmt(m.get('ssim'), 2)}"
    else:
        score = f"MSE {_fmt(m.get('mse'), 3)}"
    if m.get("asr"):
        score += f" · ASR {_fmt(m.get('asr'), 2)}"
    lines = [html.escape(score)]
    if slot["seeds"] > 1:
        lines.append(html.escape(f"best of {slot['seeds']} seeds (seed {lab.get('seed')})"))
    ladder = cell_ladder(best)
    if ladder.get("decision") == "undecided":
        lines.append(f"<span class='warn'>not saturated at {int(ladder.get('iterations') or 0):,} iterations"
                     "</span>")
    scores = [m.get("reid"), m.get("examples")]
    if all(isinstance(v, (int, float)) for v in scores):
        lines.append(html.escape(f"re-identified {round(scores[0] * scores[1])} of {int(scores[1])}"))
    if slot["failed"]:
        lines.append(f"<span class='warn'>{len(slot['failed'])} run(s) failed</span>")
    name = images.thumb(best)
    alt = f"{lab.get('attack_spec')} under {lab.get('defense')} {lab.get('strength') or ''}: {score}"
    img = f"<img class='thumb' src='{name}' alt='{html.escape(alt)}'>" if name else ""
    return f"<td>{img}{'<br>'.join(lines)}</td>"


def _matrix_html(matrices: list[dict], images: _Images) -> list[str]:
    parts = []
    for m in matrices:
        parts.append(f"<h3>{html.escape(_threat_title(m['threat']))} · {html.escape(str(m['dataset']))} · "
                     f"{html.escape(str(m['model']))}</h3>")
        # rows are sorted by (batch size, local steps) first: one header per setting, never mixed
        settings = list(dict.fromkeys(r[:2] for r in m["rows"]))
        if len(settings) == 1:
            parts.append(f"<p class='note'>batch {html.escape(_fmt(settings[0][0]))}, "
                         f"{html.escape(_fmt(settings[0][1]))} local step(s)</p>")
        if len(m["columns"]) > len(m["rows"]):
            parts.append(_matrix_by_attack(m, images, multiple=len(settings) > 1))
            continue
        head = ("<tr><th class='l'>defense \\ attack</th>"
                + "".join(f"<th>{html.escape(c)}</th>" for c in m["columns"]) + "</tr>")
        body, previous = [], None
        for row in m["rows"]:
            if len(settings) > 1 and row[:2] != previous:
                body.append(f"<tr class='group'><th colspan='{len(m['columns']) + 1}'>batch "
                            f"{html.escape(_fmt(row[0]))}, {html.escape(_fmt(row[1]))} local step(s)</th></tr>")
                previous = row[:2]
            body.append(f"<tr><th class='l'>{html.escape(_row_label(row))}</th>"
                        + "".join(_matrix_cell(m["cells"].get((row, c)), images) for c in m["columns"]) + "</tr>")
        parts.append(f"<table class='matrix'>{head}{''.join(body)}</table>")
    return parts


def _row_label(row: tuple, with_setting: bool = False) -> str:
    label = str(row[2] if not row[3] else f"{row[2]} {row[3]}")
    return f"{label} (batch {_fmt(row[0])}, {_fmt(row[1])} step(s))" if with_setting else label


def _matrix_by_attack(m: dict, images: "_Images", multiple: bool) -> str:
    """More attacks than defense settings (an audit runs a dozen on one setting): attacks as
    rows, so the matrix grows down the page instead of off its side."""
    head = ("<tr><th class='l'>attack \\ defense</th>"
            + "".join(f"<th>{html.escape(_row_label(r, multiple))}</th>" for r in m["rows"]) + "</tr>")
    body = [f"<tr><th class='l'>{html.escape(c)}</th>"
            + "".join(_matrix_cell(m["cells"].get((r, c)), images) for r in m["rows"]) + "</tr>"
            for c in m["columns"]]
    return f"<table class='matrix'>{head}{''.join(body)}</table>"


def write_report(store_path: str | Path, out: str | Path) -> dict:
    """Write index.html, plots, image files and CSV/JSON exports to `out`."""
    store = ResultStore(store_path, create=False)
    try:
        cells = store.cells()
        if not cells:
            raise GradleakError(f"store '{store_path}' holds no finished cells")
        out = Path(out)
        (out / "images").mkdir(parents=True, exist_ok=True)
        entries = strongest_attacks(cells)
        rows = attack_rows(cells)
        studies = study_tables(cells)
        images = _Images(out, store)
        parts = [f"<h1>gradleak report</h1><p class='note'>store {html.escape(str(store_path))}: "
                 f"{sum(c.kind == 'attack' for c in cells)} attack cells, "
                 f"{sum(c.kind == 'utility' for c in cells)} utility runs, "
                 f"{sum(c.kind == 'skipped' for c in cells)} attacks not run, "
                 f"{sum(c.kind == 'failed' for c in cells)} cells failed. Exports: "
                 "<a href='strongest.csv'>strongest.csv</a>, <a href='attacks.csv'>attacks.csv</a>, "
                 "<a href='utility.csv'>utility.csv</a>, <a href='results.json'>results.json</a>.</p>"]

        parts.append("<h2 id='verdict'>Verdict</h2>")
        for section in verdict_sections(entries):
            parts.append(f"<h3>{html.escape(section.title)}</h3><ul class='answer'>"
                         + "".join(f"<li>{html.escape(line)}</li>" for line in section.answers) + "</ul>"
                         + "<p class='note'>Each defense setting:</p><ul>"
                         + "".join(f"<li>{html.escape(line)}</li>" for line in section.settings) + "</ul>"
                         + "".join(f"<p class='note'>{html.escape(line)}</p>" for line in section.notes))

        matrices = best_reconstructions(cells)
        if matrices:
            parts.append("<h2 id='matrix'>Best reconstruction per defense and attack</h2><p class='note'>One "
                         "matrix per threat model, dataset and model. Each cell shows the seed in which that "
                         "attack reconstructed best (lowest MSE) under that defense: originals on top, "
                         "reconstructions below (the first "
                         f"{THUMB_IMAGES} of a larger batch), with that run's PSNR and SSIM (MSE for tabular "
                         "data). An empty cell says why: the attack was not run (the threat model or the "
                         "architecture rules it out) or it failed.</p>")
            parts.extend(_matrix_html(matrices, images))

        parts.append("<h2>Strongest attack per defense (Liu et al., Eq. 3)</h2><p class='note'>For each defense "
                     "and strength, the best value over all attacks of each metric, and the attack that "
                     "reached it, one table per threat model; ± is the half-width of the 95% interval over seeds. "
                     "A setting <em>leaks</em> when some attack copied an example exactly (MSE ≤ 1e-3) or "
                     "re-identified more examples among the gallery than chance gives (the 95% interval of the "
                     "rate, pooled over seeds, lies above chance). It <em>holds</em> only when "
                     f"{HOLDS_MIN_SEEDS}+ seeds ran, every attack saturated on its budget ladder (the last "
                     "doubling of its iterations changed neither PSNR by more than 0.5 dB nor the examples "
                     "re-identified) or is analytic, and no more examples were re-identified than chance. "
                     "'budget' is the iterations the ladders ended at. Green rows lie on the utility–privacy "
                     "frontier.</p>")
        for threat, members in _by_threat(entries).items():
            parts.append(f"<h3>{html.escape(_threat_title(threat))}</h3>")
            parts.append(_table([_with_words(e, full=True) for e in members], STRONGEST_COLUMNS,
                                lambda e: "frontier" if e.get("frontier") else ""))

        parts.append("<h2>Utility–privacy trade-off</h2><p class='note'>Per defense and strength: utility "
                     "loss against the best attack's PSNR (higher = more leaked; exact copies drawn at "
                     f"{PLOT_PSNR_CAP:g} dB), frontier dashed. Where the utility model did not train, the "
                     "x axis lists the defenses instead of a loss.</p>")
        scenarios: dict[tuple, list[dict]] = defaultdict(list)
        for e in entries:
            scenarios[tuple(e[k] for k in SCENARIO_KEYS)].append(e)
        for i, (key, members) in enumerate(scenarios.items()):
            name = f"tradeoff-{i}.png"
            if _tradeoff_plot(members, out / name, _scenario_title(key)):
                parts.append(f"<figure class='plot'><img src='{name}' alt='trade-off {i}'>"
                             f"<figcaption>{html.escape(_scenario_title(key))}</figcaption></figure>")

        rounds = leakage_by_round(cells)
        if rounds:
            parts.append("<h2>Leakage per round</h2><p class='note'>Each audited client update of the "
                         "federation, by server round: the strongest attack's PSNR (mean over the audited "
                         "clients; higher = more leaked).</p>")
            if _rounds_plot(rounds, out / "rounds.png"):
                parts.append("<figure class='plot'><img src='rounds.png' alt='leakage per round'></figure>")
            parts.append(_table(rounds, [("round", "round"), ("client", "client"), ("attack", "attack"),
                                         ("mse", "MSE"), ("psnr", "PSNR"), ("ssim", "SSIM"), ("lpips", "LPIPS"),
                                         ("asr", "ASR")]))

        if studies:
            parts.append("<h2>Studies (Wei et al. style)</h2>")
            for title, table in studies.items():
                parts.append(f"<h3>ASR and iterations vs {html.escape(title)}</h3>")
                parts.append(_table(table, [("threat", "threat"), ("dataset", "dataset"), ("model", "model"),
                                            ("attack", "attack"), (title, title), ("asr", "ASR"),
                                            ("iterations", "iterations"), ("psnr", "PSNR"), ("cells", "cells")]))

        parts.append("<h2>All attack results</h2>")
        metric_cols = [(m, m.upper()) for m in ("mse", "psnr", "ssim", "lpips", "label_acc", "asr", "iterations")]
        parts.append(_table(rows, [("attack_spec", "attack"), ("dataset", "dataset"), ("batch_size", "batch"),
                                   ("local_steps", "local steps"), ("defense", "defense"),
                                   ("strength", "strength"), *metric_cols, ("seconds", "seconds")]))

        skipped = [c for c in cells if c.kind == "skipped"]
        if skipped:
            parts.append("<h2>Attacks not run</h2><p class='note'>Each attack the threat model or the "
                         "architecture rules out, with the reason.</p>")
            parts.append(_table([{"attack": c.labels.get("attack_spec"), "model": c.labels.get("model"),
                                  "defense": c.labels.get("defense"), "reason": c.labels.get("reason")}
                                 for c in skipped],
                                [("attack", "attack"), ("model", "model"), ("defense", "defense"),
                                 ("reason", "reason")]))

        failed = [c for c in cells if c.kind == "failed"]
        if failed:
            parts.append("<h2>Cells that failed</h2><p class='note'>Each cell that raised, with its error; "
                         "running the sweep again retries them. Their results are missing from every "
                         "table above.</p>")
            parts.append(_table([{"kind": c.labels.get("cell_kind"), "what": c.labels.get("attack_spec"),
                                  "dataset": c.labels.get("dataset"), "model": c.labels.get("model"),
                                  "defense": c.labels.get("defense"), "batch": c.labels.get("batch_size"),
                                  "error": c.extras.get("error") if isinstance(c.extras, dict) else None}
                                 for c in failed],
                                [("kind", "cell"), ("what", "attack"), ("dataset", "dataset"), ("model", "model"),
                                 ("defense", "defense"), ("batch", "batch"), ("error", "error")]))

        parts.append("<h2 id='gallery'>All reconstructions</h2><p class='note'>Originals (top) vs "
                     "reconstructions (bottom) of every attack cell, grouped by defense (click to open).</p>")
        n_images = 0
        # by defense (undefended first), then as the tables are: threat model, scenario, strength, attack, seed
        grids = sorted((c for c in cells if c.kind == "attack" and c.grid_png is not None),
                       key=lambda c: (c.labels.get("defense") != "none", str(c.labels.get("defense")),
                                      *[str(c.labels.get(k, "")) for k in SCENARIO_KEYS],
                                      str(c.labels.get("strength")), str(c.labels.get("attack_spec")),
                                      str(c.labels.get("seed"))))
        by_defense: dict[str, list] = defaultdict(list)
        for c in grids:
            by_defense[str(c.labels.get("defense"))].append(c)
        for defense, grid_cells in by_defense.items():
            figures = []
            for cell in grid_cells:
                image = images.grid(cell)
                n_images += 1
                lab = cell.labels
                caption = (f"{lab.get('threat', '')} · {lab.get('attack_spec')} · {lab.get('defense')} "
                           f"{lab.get('strength')} · batch {lab.get('batch_size')} · T={lab.get('local_steps')} · "
                           f"seed {lab.get('seed')} · PSNR {_fmt(cell.metrics.get('psnr'), 3)}")
                figures.append(f"<figure><img src='{image}' alt='{html.escape(caption)}'>"
                               f"<figcaption>{html.escape(caption)}</figcaption></figure>")
            parts.append(f"<details><summary>{html.escape(defense)} ({len(grid_cells)} reconstruction"
                         f"{'s' if len(grid_cells) != 1 else ''})</summary>{''.join(figures)}</details>")

        page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>gradleak report</title>"
                f"<style>{_CSS}</style><script>{_CHECK_SCRIPT}</script></head><body>"
                + "\n".join(parts) + "</body></html>")
        (out / "index.html").write_text(page)
        _exports(out, cells, entries, rows, store)
        return {"out": str(out), "html": str(out / "index.html"), "cells": len(cells), "grids": n_images,
                "strongest": entries}
    finally:
        store.close()


def _write_csv(path: Path, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})


def _exports(out: Path, cells, entries, rows, store: ResultStore) -> None:
    _write_csv(out / "strongest.csv", entries)
    _write_csv(out / "attacks.csv", [{k: v for k, v in r.items() if k != "keys"} for r in rows])
    _write_csv(out / "utility.csv", [{**c.labels, **c.metrics, "seconds": c.seconds, "key": c.key}
                                     for c in cells if c.kind == "utility"])
    payload = {"strongest": entries,
               "cells": [{"key": c.key, "kind": c.kind, "sweep": c.sweep, "spec": c.spec, "labels": c.labels,
                          "metrics": c.metrics, "seconds": c.seconds,
                          "per_image": [im.metrics for im in store.images(c.key)]} for c in cells]}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))

