"""`gradleak attack`'s human-readable summary: the headline PSNR (from the mean MSE) comes with the
per-image median and range, and an attack that reconstructed nothing says so instead of a PSNR."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from gradleak.commands.attack import psnr_line

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
# digits test split, first batch of 4: labels 0, 6, 0, 1 (no 9)
SCENARIO = ("--dataset", "digits", "--model", "mlp", "--batch-size", "4", "--lpips", "none", "--threat", "malicious")


def _attack(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "gradleak", "attack", *SCENARIO, *args], env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def _json(attack: str) -> dict:
    return json.loads(_attack("--attack", attack, "--json").stdout)


def test_headline_psnr_comes_with_the_per_image_median_and_range():
    m = _json("fc-analytic")["metrics"]
    # the headline is the PSNR of the mean MSE, below the per-image median here (one image is exact)
    assert math.isclose(m["psnr"], 10 * math.log10(1 / m["mse"]), rel_tol=1e-6)
    assert m["psnr_min"] < m["psnr"] < m["psnr_median"] <= m["psnr_max"] and m["matched"] == 1.0
    text = _attack("--attack", "fc-analytic").stdout
    rows = [line for line in text.splitlines() if line.strip().startswith("psnr")]
    assert len(rows) == 1
    assert rows[0].split() == ["psnr", f"{m['psnr']:.1f}", "dB", "(from", "mean", "MSE;", "per", "image",
                               "median", f"{m['psnr_median']:.1f},", "range",
                               f"{m['psnr_min']:.1f}\u2013{m['psnr_max']:.1f})"]
    assert "nothing reconstructed" not in text


def test_fishing_without_the_target_class_says_nothing_was_reconstructed_instead_of_a_psnr():
    result = _json("fishing:target_class=9")
    assert result["metrics"]["matched"] == 0.0 and result["metrics"]["asr"] == 0.0
    assert result["extras"]["nothing_reconstructed"] == [True]
    # --json keeps every metric (scored against all-zero images) for machines to read
    assert result["metrics"]["psnr"] is not None
    proc = _attack("--attack", "fishing:target_class=9")
    lines = proc.stdout.splitlines()
    assert not any(line.strip().startswith("psnr") for line in lines)  # no PSNR row at all
    said = [line for line in lines if "nothing reconstructed" in line]
    assert len(said) == 1 and lines.index(said[0]) == 1  # right under the scenario line
    assert re.search(r"no example of target_class 9 in the batch.*classes 0, 1, 6; no PSNR", said[0])


def test_fishing_with_some_targets_reports_the_unreconstructed_ones_beside_the_psnr():
    text = _attack("--attack", "fishing:target_class=0").stdout
    row = next(line for line in text.splitlines() if line.strip().startswith("psnr"))
    assert "per image median" in row and "2 of 4 images not reconstructed, scored as all-zero" in row


def test_psnr_line_edge_cases():
    one = {"psnr": 100.0, "psnr_median": 100.0, "psnr_min": 100.0, "psnr_max": 100.0, "matched": 1.0}
    assert psnr_line(one, 1).split() == ["psnr", "100.0", "dB"]  # one image: nothing to add
    tabular = {"psnr": None, "psnr_median": None, "psnr_min": None, "psnr_max": None, "matched": 1.0}
    assert psnr_line(tabular, 4).split() == ["psnr", "n/a"]
    nothing = {"psnr": 9.0, "psnr_median": 9.0, "psnr_min": 8.0, "psnr_max": 10.0, "matched": 0.0}
    assert psnr_line(nothing, 8) == ("nothing reconstructed: the attack returned no image for any of the 8 "
                                     "examples; no PSNR (the other metrics score all-zero images)")
