"""Fuzz suite: generated malformed and hostile inputs (tests/support/fuzzing.py) against every
sub-command and every file reader. Each case must give exit code 2 and exactly one
line on stderr, with no traceback, no file written outside its output folder, no
code run from a file and no NaN or infinity printed as a result. The in-process
run calls `gradleak.cli.main`; a sample also runs as real processes with a timeout."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.fuzzing import MARKER, Case, generate_cases, make_files, subprocess_sample

REPO = Path(__file__).resolve().parents[2]
CASES = generate_cases()
NON_FINITE = re.compile(r"(?<![A-Za-z_])(nan|NaN|-?inf|-?Infinity)(?![A-Za-z_])")
SECONDS_PER_CASE = 20.0  # a case that gets past validation and starts real work fails here


def test_case_count():
    assert len(CASES) >= 1000, len(CASES)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz") / "files"
    make_files(root)
    return root


def _snapshot(*folders: Path) -> dict[str, tuple[int, int]]:
    seen = {}
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d not in ("__pycache__", ".git", ".venv", ".pytest_cache",
                                                              ".mypy_cache", ".ruff_cache")]
            for name in filenames:  # (a folder's mtime moves when SQLite adds and removes its journal)
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                seen[path] = (st.st_size, st.st_mtime_ns)
    return seen


def _top_level(folder: Path) -> set[str]:
    return set(os.listdir(folder))


def check_outcome(case: Case, code: int, out: str, err: str) -> None:
    lines = err.strip("\n").splitlines()
    assert code == 2, f"exit {code} (expected 2); stderr: {err[-800:]!r}; stdout: {out[-300:]!r}"
    assert len(lines) == 1, f"{len(lines)} stderr lines: {err[-1500:]!r}"
    assert lines[0].startswith("gradleak"), lines[0]
    assert "Traceback" not in err and "Traceback" not in out
    assert "internal error" not in lines[0], lines[0]
    assert not NON_FINITE.search(out), f"non-finite number printed: {out[:300]!r}"
    if case.expect:
        assert case.expect.lower() in lines[0].lower(), f"{case.expect!r} not named in {lines[0]!r}"


def _params(cases):
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(reason=c.xfail, strict=True)] if c.xfail else [])
            for c in cases]


@pytest.fixture(scope="module")
def watched(files):
    """Folders no case may write into: the package's data (weights, configs), the hostile
    files; the repository root's listing is compared too. (Not the package's sources:
    they may change while the suite runs in a working copy.)"""
    return [REPO / "gradleak" / "assets", REPO / "gradleak" / "configs", files]


@pytest.mark.parametrize("case", _params(CASES))
def test_in_process(case: Case, files: Path, watched, tmp_path, monkeypatch, capsys):
    import time

    from gradleak.cli import main

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    monkeypatch.chdir(out_dir)
    monkeypatch.setenv("HOME", str(out_dir))  # a default written under ~ stays inside the output folder
    monkeypatch.delenv("GRADLEAK_DEBUG", raising=False)
    before, repo_top, parent_top = _snapshot(*watched), _top_level(REPO), _top_level(tmp_path)
    start = time.perf_counter()
    code = main(case.resolve(files, out_dir))
    seconds = time.perf_counter() - start
    captured = capsys.readouterr()
    assert not (files / MARKER).exists(), "a pickle payload ran"
    check_outcome(case, code, captured.out, captured.err)
    assert _snapshot(*watched) == before, "a file was written outside the output folder"
    assert _top_level(REPO) == repo_top and _top_level(tmp_path) == parent_top == {"out"}
    assert seconds < SECONDS_PER_CASE, f"took {seconds:.1f} s: the input was not refused at validation"


SUBPROCESS_CASES = subprocess_sample(CASES)


def test_subprocess_sample(files: Path, tmp_path):
    """The same promises from a real process (interpreter start, imports, exit status), with a timeout."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("GRADLEAK_DEBUG", None)

    def run(case: Case):
        out_dir = tmp_path / case.id.replace("/", "_")[:80]
        out_dir.mkdir()
        argv = [a for a in case.resolve(files, out_dir)]
        proc = subprocess.run([sys.executable, "-m", "gradleak", *argv], cwd=out_dir, env={**env, "HOME": str(out_dir)},
                              capture_output=True, text=True, timeout=120)
        return case, proc

    assert len(SUBPROCESS_CASES) >= 20
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, SUBPROCESS_CASES))
    for case, proc in results:
        try:
            check_outcome(case, proc.returncode, proc.stdout, proc.stderr)
        except AssertionError as exc:
            raise AssertionError(f"{case.id}: {exc}") from None
    assert not (files / MARKER).exists(), "a pickle payload ran"
