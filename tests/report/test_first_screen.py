"""The report's first screen: the answer, then one table per scenario (a row per defense
setting, each threat model's grade as a chip beside its linkage AUC and recognizable rate, the
utility loss and the budget), readable in a 1400 × 900 window without scrolling."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import pytest

from gradleak.analysis import strongest_attacks
from gradleak.report import write_report
from gradleak.report.summary import summary_tables
from gradleak.store import CellRecord, ResultStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BUDGET = 0.02
# ten defense settings, the most a demo's table is designed for: (defense, strength, the attack's
# evidence per seed as (examples re-identified of 40, copies, mean linkage AUC), accuracy lost)
SETTINGS = [("none", "", (40, 40, 1.0), 0.0), ("noise", "sigma=0.001", (30, 0, 0.95), 0.001),
            ("noise", "sigma=0.01", (6, 0, 0.8), 0.004), ("noise", "sigma=0.1", (0, 0, 0.75), 0.08),
            ("dpsgd", "epsilon=8", (0, 0, 0.5), 0.01), ("dpsgd", "epsilon=1", (0, 0, 0.5), 0.05),
            ("clip", "norm=1", (2, 0, 0.7), 0.002), ("prune", "ratio=0.9", (0, 0, 0.62), 0.03),
            ("prune", "ratio=0.99", (0, 0, 0.5), 0.4), ("quantize", "bits=2", (12, 1, 0.9), 0.02)]
SEEDS = (0, 1, 2)
BASELINE = {0: 0.80, 1: 0.82, 2: 0.78}


def _cells() -> list[CellRecord]:
    """A study of the ten settings under two threat models (the malicious server's attack the
    honest one's, plus copies under every setting but the strongest ones) and their utility runs."""
    cells = []
    for defense, strength, (identified, copies, linkage), lost in SETTINGS:
        for threat in ("honest", "malicious"):
            if threat == "malicious" and linkage < 0.6:
                identified, copies, linkage = 1, 0, 0.55
            for seed in SEEDS:
                labels = {"threat": threat, "dataset": "mnist", "model": "lenet", "batch_size": 4, "local_steps": 1,
                          "seed": seed, "defense": defense, "strength": strength, "defenses": [], "attack": "ig",
                          "attack_spec": "ig:iterations=200", "init": None, "utility_budget": BUDGET}
                metrics = {"mse": 0.05, "psnr": 13.0, "ssim": 0.1, "asr": copies / 40, "examples": 40,
                           "reid": identified / 40, "reid_chance": 2 / 1001, "gallery": 1000,
                           "recognizable": identified / 40, "linkage": linkage, "linkage_sd": 0.05}
                ladder = {"decision": "saturated", "saturated": True, "iterations": 200,
                          "gallery": "1,000 train-split examples of mnist", "batches": []}
                cells.append(CellRecord(f"{threat}{defense}{strength}{seed}", "attack", "t", {}, labels, metrics,
                                        {"ladder": ladder}, 1.0))
        for seed in SEEDS:
            labels = {"dataset": "mnist", "model": "lenet", "defense": defense, "strength": strength, "seed": seed}
            metrics = {"test_accuracy": BASELINE[seed] - lost * (1 + 0.1 * seed), "num_classes": 10,
                       **({"epsilon": float(strength.split("=")[1])} if defense == "dpsgd" else {})}
            cells.append(CellRecord(f"utility{defense}{strength}{seed}", "utility", "t", {}, labels, metrics, {}, 1.0))
    return cells


@pytest.fixture()
def report(tmp_path):
    with ResultStore(tmp_path / "store.db") as store:
        for cell in _cells():
            store.add_cell(cell)
    write_report(tmp_path / "store.db", tmp_path / "report")
    return tmp_path / "report"


def test_one_table_per_scenario_with_a_chip_per_threat_model():
    (table,) = summary_tables(strongest_attacks(_cells()))
    assert table.title == "mnist/lenet, batch 4, 1 local step(s)"
    assert table.threats == ["Honest-but-curious server", "Malicious server"] and table.dp
    assert table.budget == "0.02"
    rows = {row.setting: row for row in table.rows}
    assert sorted(rows) == sorted(f"{d} {s}".strip() for d, s, _, _ in SETTINGS)
    assert [c.chip.text for c in rows["none"].threats if c.chip] == ["copies", "copies"]
    assert rows["noise sigma=0.001"].threats[0].chip.css_class == "recognizable"
    assert rows["noise sigma=0.1"].threats[0].chip.text == "linkable"
    assert rows["dpsgd epsilon=8"].threats[0].chip.text == "holds" and rows["dpsgd epsilon=8"].epsilon == "8"
    assert rows["none"].epsilon == "–"
    # the evidence with its 95% interval, the utility loss with its half-width
    assert re.fullmatch(r"0\.50 \(0\.\d\d–0\.\d\d\)", rows["dpsgd epsilon=8"].threats[0].linkage)
    assert re.fullmatch(r"0 of 120 \(0–[\d.]+%\)", rows["dpsgd epsilon=8"].threats[0].recognizable)
    assert " ± " in rows["dpsgd epsilon=8"].utility
    # within the budget: the loss's 95% upper bound at most 0.02; the undefended run costs nothing
    assert rows["none"].within == "yes" and rows["noise sigma=0.001"].within == "yes"
    assert rows["dpsgd epsilon=1"].within == "no" and rows["prune ratio=0.99"].within == "no"


def test_the_answer_comes_first_then_the_table_then_the_sentences(report):
    page = (report / "index.html").read_text()
    answer, table = page.index("id='answer'"), page.index("<table class='summary'>")
    assert page.index("id='verdict'") < answer < table < page.index("each defense setting") < page.index("id='matrix'")
    assert page.count("<table class='summary'>") == 1
    assert page.count("<span class='chip ") >= 2 * len(SETTINGS)
    assert "within budget<br>(≤ 0.02 at 95%)" in page
    assert (report / "tradeoff-0.png").stat().st_size > 0 and (report / "tradeoff-1.png").stat().st_size > 0


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_answer_and_table_fit_a_1400_by_900_window(report):
    """In a real browser: the page's script writes where the answer and the table's last row
    end (px from the top) into its title; both must lie within the first 900 px."""
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                               "--disable-background-networking", "--disable-component-update", "--no-first-run",
                               f"--user-data-dir={profile}", "--window-size=1400,900", "--hide-scrollbars",
                               "--virtual-time-budget=10000", "--dump-dom", (report / "index.html").as_uri()],
                              capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    title = re.search(r"<title>(.*?)</title>", proc.stdout)
    assert title, proc.stderr[-2000:]
    found = dict(re.findall(r"(answer|table|errors|broken)=(-?\d+)", title.group(1)))
    assert found["errors"] == "0" and found["broken"] == "0", title.group(1)
    assert 0 < int(found["answer"]) < int(found["table"]) <= 900, title.group(1)


def test_a_dp_row_shows_the_reconstruction_bound_beside_its_epsilon():
    entries = [{**e, "rero_bound": 0.0077} if e["defense"] == "dpsgd" else e for e in strongest_attacks(_cells())]
    (table,) = summary_tables(entries)
    rows = {row.setting: row for row in table.rows}
    assert rows["dpsgd epsilon=8"].epsilon == "8 (0.0077)" and rows["none"].epsilon == "–"


def test_the_rows_the_answers_name_are_marked_with_their_threat_models():
    from gradleak.analysis import answer

    entries = strongest_attacks(_cells())
    (table,) = summary_tables(entries)
    expected: dict[str, set] = {}
    for a in answer(entries):
        for e in a["named"]:
            name = f"{e['defense']} {e['strength']}".strip()
            expected.setdefault(name, set()).add(
                "Honest-but-curious server" if e["threat"] == "honest" else "Malicious server")
    assert expected  # the answers name something
    assert {row.setting: set(row.named) for row in table.rows if row.named} == expected
