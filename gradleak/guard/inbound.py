"""Inbound: is the model the server sent crafted to leak?

A client sees only the arrays it received (and, from the second round on, the arrays of the
round before and its own last update). These checks read nothing else, so they work on a
Flower ArrayRecord's state dict as well as on an `nn.Module`:

- structure: parameters added, removed or reshaped since the previous round (Robbing the
  Fed's imprint block in front of the model; any inserted layer);
- duplicate rows: two rows of a weight matrix equal (exactly, or to cosine 0.999 for rows
  of 16 entries or more); with distinct biases they are a binning layer (Robbing the Fed's
  thresholds on one query; MKOR's owned rows);
- zero rows: two or more rows of a weight matrix exactly zero, but not all of them (class
  fishing zeroes the head but for one class; MKOR's unused channels);
- rank one: a weight matrix (both sides >= 4) whose second singular value is below 1e-3 of
  the first (Robbing the Fed's read-out, a fished head);
- one-tap rows: two or more rows of 9 entries or more with 95 % of their energy in one
  entry (MKOR's copy filters, also with noise added);
- scale jump: a tensor's RMS more than `MAX_SCALE_RATIO` times larger or smaller than in
  the previous round (fishing's extreme bias);
- change beyond FedAvg: a weight's change since the previous round more than
  `MAX_CHANGE_RATIO` times the norm of the client's own last change to it. A FedAvg step is
  an average of client updates of one training recipe; a server that rewrites a layer moves
  it by far more.

The thresholds' honest margins are measured in docs/guard.md (benchmarks/pipeline/bench_guard.py).
A fully zero tensor is not flagged (LoRA's B, zero-initialised residual branches), nor is
any one-dimensional tensor on its own (biases, norms, buffers).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping

import torch

Tensors = Mapping[str, torch.Tensor]

NEAR_DUPLICATE_COSINE = 0.999
MIN_ROW_FOR_COSINE = 16  # shorter rows can be near-parallel by chance
MAX_ROWS_FOR_COSINE = 8192  # beyond: exact duplicates only (the Gram matrix would be too large)
MIN_ZERO_ROWS = 2  # one zero row can be honest (an embedding's padding index)
RANK_ONE_RATIO = 1e-3
MIN_RANK_SIDE = 4
ONE_TAP_ENERGY = 0.95
MIN_ONE_TAP_ROW = 9
MIN_ONE_TAP_ROWS = 2
MAX_SCALE_RATIO = 3.0
MAX_CHANGE_RATIO = 50.0


@dataclass(frozen=True)
class Finding:
    """One check that fired, on one tensor."""

    check: str
    tensor: str
    detail: str

    def to_dict(self) -> dict:
        return {"check": self.check, "tensor": self.tensor, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.check} in {self.tensor}: {self.detail}"


@dataclass
class InboundReport:
    """The checks that fired on a received model (none: nothing suspicious), and each check's
    margin: its statistic over its threshold, largest over the tensors (≥ 1 where it fires;
    infinite for an exact duplicate row or a changed structure)."""

    findings: list[Finding] = field(default_factory=list)
    compared_with_previous: bool = False
    seconds: float = 0.0
    margins: dict[str, float] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """The detector's score: the largest margin of any check (0 when none ran). A ROC over
        it says how far honest models sit from the thresholds (benchmarks/pipeline/bench_guard)."""
        return max(self.margins.values(), default=0.0)

    @property
    def crafted(self) -> bool:
        return bool(self.findings)

    @property
    def checks(self) -> list[str]:
        return sorted({f.check for f in self.findings})

    def summary(self) -> str:
        if not self.findings:
            return "no sign of a crafted model"
        shown = "; ".join(str(f) for f in self.findings[:3])
        more = f" (+{len(self.findings) - 3} more)" if len(self.findings) > 3 else ""
        return f"crafted model: {shown}{more}"

    def to_dict(self) -> dict:
        return {"crafted": self.crafted, "checks": self.checks, "findings": [f.to_dict() for f in self.findings],
                "compared_with_previous": self.compared_with_previous, "seconds": round(self.seconds, 4),
                "score": json_score(self.score)}


def state_of(model_or_state) -> dict[str, torch.Tensor]:
    """A detached CPU state dict of an `nn.Module`, or of a mapping of arrays."""
    state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
    return {k: torch.as_tensor(v).detach().cpu() for k, v in state.items()}


def inspect_received(received, previous=None, own_change: Tensors | None = None) -> InboundReport:
    """Check a received model (an nn.Module or a state dict) for the signs of a crafted one.

    previous:   the model (or state) received in the round before, if any;
    own_change: this client's own last update to it (`previous` minus what it sent back),
                the scale of what an honest FedAvg step moves each weight by.
    """
    start = time.perf_counter()
    state = state_of(received)
    before = state_of(previous) if previous is not None else None
    findings: list[Finding] = []
    margins: dict[str, float] = {}
    if before is not None:
        findings += structure_findings(state, before)
        _note(margins, "structure", math.inf if findings else 0.0)
    for name, tensor in state.items():
        if not tensor.is_floating_point() or tensor.dim() < 2 or tensor.shape[0] < 2:
            continue
        matrix = tensor.reshape(tensor.shape[0], -1).double()
        if matrix.shape[1] < 2 or not bool(matrix.any()):
            continue
        bias = _bias_of(name, state, matrix.shape[0])
        findings += row_findings(name, matrix, bias, margins)
    if before is not None:
        findings += change_findings(state, before, own_change, margins)
    return InboundReport(findings, before is not None, time.perf_counter() - start, margins)


def structure_findings(state: Tensors, before: Tensors) -> list[Finding]:
    added = [k for k in state if k not in before]
    removed = [k for k in before if k not in state]
    reshaped = [k for k in state if k in before and tuple(state[k].shape) != tuple(before[k].shape)]
    out = []
    if added:
        out.append(Finding("structure", added[0], f"{len(added)} tensor(s) not in the previous round's model: "
                                                  f"{', '.join(added[:4])}"))
    if removed:
        out.append(Finding("structure", removed[0], f"{len(removed)} tensor(s) of the previous round's model "
                                                    f"missing: {', '.join(removed[:4])}"))
    for k in reshaped[:4]:
        out.append(Finding("structure", k, f"shape {tuple(before[k].shape)} became {tuple(state[k].shape)}"))
    return out


def row_findings(name: str, matrix: torch.Tensor, bias: torch.Tensor | None,
                 margins: dict[str, float] | None = None) -> list[Finding]:
    """The row checks of one weight matrix (rows: output units or filters); each check's margin
    goes into `margins`."""
    margins = {} if margins is None else margins
    out = []
    rows, width = matrix.shape
    norms = matrix.norm(dim=1)
    zero = norms == 0
    zero_rows = int(zero.sum())
    _note(margins, "zero_rows", zero_rows / MIN_ZERO_ROWS if zero_rows < rows else 0.0)
    if MIN_ZERO_ROWS <= zero_rows < rows:
        out.append(Finding("zero_rows", name, f"{zero_rows} of {rows} rows exactly zero"))
    live = matrix[~zero]
    duplicates, binning, nearest = _duplicate_rows(live, bias[~zero] if bias is not None else None)
    _note(margins, "duplicate_rows", nearest)
    if duplicates:
        what = "a binning layer: " if binning else ""
        out.append(Finding("duplicate_rows", name, f"{what}{duplicates} of {rows} rows repeat another row"
                                                   + (" with distinct biases" if binning else "")))
    if min(rows, width) >= MIN_RANK_SIDE:
        gram = matrix @ matrix.T if rows <= width else matrix.T @ matrix
        eig = torch.linalg.eigvalsh(gram).clamp_min(0).flip(0)
        second = float((eig[1] / eig[0]).sqrt()) if eig[0] > 0 else None  # σ₂/σ₁
        if second is not None:
            _note(margins, "rank_one", RANK_ONE_RATIO / second if second > 0 else math.inf)
        if second is not None and second < RANK_ONE_RATIO:
            out.append(Finding("rank_one", name, f"rank one ({rows}x{width}): second singular value "
                                                 f"{second:.1e} of the first"))
    if width >= MIN_ONE_TAP_ROW and len(live):
        energy = live.pow(2)
        share = energy.max(dim=1).values / energy.sum(dim=1)
        if len(share) >= MIN_ONE_TAP_ROWS:  # the MIN_ONE_TAP_ROWS-th most one-tap row decides
            _note(margins, "one_tap_rows", float(share.sort(descending=True).values[MIN_ONE_TAP_ROWS - 1])
                  / ONE_TAP_ENERGY)
        taps = int((share >= ONE_TAP_ENERGY).sum())
        if taps >= MIN_ONE_TAP_ROWS:
            out.append(Finding("one_tap_rows", name, f"{taps} of {rows} rows hold >= {ONE_TAP_ENERGY:.0%} "
                                                     "of their energy in one entry"))
    return out


def change_findings(state: Tensors, before: Tensors, own_change: Tensors | None,
                    margins: dict[str, float] | None = None) -> list[Finding]:
    """A tensor's scale, and a weight's change, against the previous round's; each check's
    margin goes into `margins`."""
    margins = {} if margins is None else margins
    out = []
    for name, tensor in state.items():
        old = before.get(name)
        if old is None or tuple(old.shape) != tuple(tensor.shape) or not tensor.is_floating_point():
            continue
        new_rms, old_rms = _rms(tensor), _rms(old)
        if old_rms > 0 and new_rms > 0 and tensor.numel() > 1:
            ratio = new_rms / old_rms
            _note(margins, "scale_jump", max(ratio, 1 / ratio) / MAX_SCALE_RATIO)
            if ratio > MAX_SCALE_RATIO or ratio < 1 / MAX_SCALE_RATIO:
                out.append(Finding("scale_jump", name, f"RMS {old_rms:.3g} in the previous round, now "
                                                       f"{new_rms:.3g} (x{ratio:.3g})"))
        own = own_change.get(name) if own_change is not None else None
        if own is not None and tuple(own.shape) == tuple(tensor.shape) and tensor.dim() >= 2:
            own_norm = float(own.double().norm())
            change = float((tensor.double() - old.double()).norm())
            if own_norm > 0:
                _note(margins, "change_beyond_fedavg", change / own_norm / MAX_CHANGE_RATIO)
            if own_norm > 0 and change > MAX_CHANGE_RATIO * own_norm:
                out.append(Finding("change_beyond_fedavg", name,
                                   f"changed by {change:.3g} since the previous round, "
                                   f"{change / own_norm:.3g}x this client's own last update ({own_norm:.3g})"))
    return out


def _duplicate_rows(rows: torch.Tensor, bias: torch.Tensor | None) -> tuple[int, bool, float]:
    """How many rows repeat another (exactly, or nearly for long rows), whether repeated rows
    carry different biases (a binning layer), and the margin: (1 − threshold) / (1 − the largest
    cosine between two rows), infinite for an exact repeat."""
    if len(rows) < 2:
        return 0, False, 0.0
    _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
    repeated = counts[inverse] > 1
    margin = math.inf if bool(repeated.any()) else 0.0
    if rows.shape[1] >= MIN_ROW_FOR_COSINE and len(rows) <= MAX_ROWS_FOR_COSINE:
        unit = rows / rows.norm(dim=1, keepdim=True)
        cosine = unit @ unit.T
        cosine.fill_diagonal_(0)
        repeated |= (cosine > NEAR_DUPLICATE_COSINE).any(dim=1)
        nearest = float(cosine.max())
        margin = max(margin, (1 - NEAR_DUPLICATE_COSINE) / (1 - nearest) if nearest < 1 else math.inf)
    count = int(repeated.sum())
    binning = bool(count and bias is not None and len(torch.unique(bias[repeated])) > 1)
    return count, binning, margin


def _bias_of(name: str, state: Tensors, rows: int) -> torch.Tensor | None:
    if not name.endswith("weight"):
        return None
    bias = state.get(name[: -len("weight")] + "bias")
    if bias is None or bias.dim() != 1 or bias.numel() != rows:
        return None
    return bias.double()


def _note(margins: dict[str, float], check: str, value: float) -> None:
    """Keep the largest margin of `check` over the tensors."""
    margins[check] = max(margins.get(check, 0.0), value)


def json_score(value: float) -> float | str:
    """A margin or score for JSON (which has no infinity): the number to 4 decimals, or "inf"."""
    return round(value, 4) if math.isfinite(value) else "inf"


def _rms(tensor: torch.Tensor) -> float:
    return float(tensor.double().pow(2).mean().sqrt())
