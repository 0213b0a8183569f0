"""What a careful client can check on a received model before training on it.

Wang et al. (§2, §3.2.3) lists the checks that expose malicious-server attacks:
layers dominated by exact zeros, an FC layer far larger than a CNN needs,
and a batch gradient dominated by a few samples. We add weight statistics
against an honest model of the same architecture. Every number is computed
for the received model and for an honest reference (same architecture,
another seed), and a check flags the model when it leaves the honest range.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from scipy.stats import ks_2samp
from torch import nn

from .fl.local import batch_loss

# Flag thresholds (a client's rule of thumb, documented in docs/mkor.md).
MAX_ZERO_SHARE = 0.5  # Wang et al.: "the majority of weights are 0 in a layer"
MAX_FC_GROWTH = 1.5  # widest FC layer vs the honest architecture's, relative to the input size
MAX_SAMPLE_SHARE_GROWTH = 3.0  # largest single-sample share vs the honest model's
MAX_SILENT_SAMPLES = 0.2  # samples whose gradient is < 1e-3 of the largest one
MAX_KS = 0.3  # honest-vs-honest inits give about 0.05
KS_SAMPLE = 20000


@dataclass
class LayerReport:
    name: str
    numel: int
    zero_share: float
    mean: float
    std: float
    honest_mean: float
    honest_std: float
    std_ratio: float
    ks: float


@dataclass
class ModelReport:
    input_size: int
    layers: list[LayerReport]
    max_zero_share: float
    widest_fc: int
    widest_fc_ratio: float  # widest FC width / input size
    honest_widest_fc_ratio: float
    max_sample_share: float  # max_k ||g_k|| / sum_k ||g_k||  (1/B when balanced)
    honest_max_sample_share: float
    silent_sample_share: float
    honest_silent_sample_share: float
    max_ks: float
    batch_size: int
    extra_parameters: list[str] = field(default_factory=list)  # no honest counterpart
    flags: dict[str, bool] = field(default_factory=dict)

    @property
    def suspicious(self) -> bool:
        return any(self.flags.values())

    def to_dict(self) -> dict:
        out = asdict(self)
        out["suspicious"] = self.suspicious
        return out


def per_sample_gradient_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||∇θ ℓ(x_k, y_k)|| for each sample (one backward pass each: memory stays at one model)."""
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for k in range(x.shape[0]):
        loss = batch_loss(model(x[k:k + 1]), y[k:k + 1])
        grads = torch.autograd.grad(loss, params)
        norms.append(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    return torch.stack(norms).float()


def _gradient_shares(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    norms = per_sample_gradient_norms(model, x, y)
    share = float(norms.max() / norms.sum().clamp(min=1e-30))
    silent = float((norms < 1e-3 * norms.max()).float().mean())
    return share, silent


def _widest_fc(model: nn.Module) -> int:
    return max((m.out_features for m in model.modules() if isinstance(m, nn.Linear)), default=0)


def _ks(a: torch.Tensor, b: torch.Tensor, gen: torch.Generator) -> float:
    a, b = a.flatten(), b.flatten()
    if a.numel() > KS_SAMPLE:
        a = a[torch.randperm(a.numel(), generator=gen)[:KS_SAMPLE]]
    if b.numel() > KS_SAMPLE:
        b = b[torch.randperm(b.numel(), generator=gen)[:KS_SAMPLE]]
    return float(ks_2samp(a.double().numpy(), b.double().numpy()).statistic)


def inspect_model(received: nn.Module, honest: nn.Module, x: torch.Tensor, y: torch.Tensor) -> ModelReport:
    """Compare a received model with an honest one of the same architecture on a real batch."""
    gen = torch.Generator().manual_seed(0)
    honest_params = dict(honest.named_parameters())
    layers = []
    extra = []
    for name, p in received.named_parameters():
        # a wrapper (e.g. an inserted layer) may prefix the original names
        h = honest_params.get(name)
        if h is None:
            h = next((hp for hn, hp in honest_params.items()
                      if name.endswith("." + hn) and hp.shape == p.shape), None)
        w = p.detach()
        if h is None or h.shape != p.shape:
            extra.append(name)
        hw = h.detach() if h is not None and h.shape == p.shape else w
        std, hstd = float(w.std()) if w.numel() > 1 else 0.0, float(hw.std()) if hw.numel() > 1 else 0.0
        layers.append(LayerReport(
            name=name, numel=w.numel(), zero_share=float((w == 0).float().mean()),
            mean=float(w.mean()), std=std, honest_mean=float(hw.mean()), honest_std=hstd,
            std_ratio=std / hstd if hstd > 0 else float("inf") if std > 0 else 1.0,
            ks=_ks(w, hw, gen) if w.numel() > 1 and hw is not w else 0.0))
    input_size = int(x[0].numel())
    share, silent = _gradient_shares(received, x, y)
    h_share, h_silent = _gradient_shares(honest, x, y)
    weights = [l for l in layers if l.name.endswith("weight")]
    report = ModelReport(
        input_size=input_size, layers=layers,
        max_zero_share=max(l.zero_share for l in weights),
        widest_fc=_widest_fc(received), widest_fc_ratio=_widest_fc(received) / input_size,
        honest_widest_fc_ratio=_widest_fc(honest) / input_size,
        max_sample_share=share, honest_max_sample_share=h_share,
        silent_sample_share=silent, honest_silent_sample_share=h_silent,
        max_ks=max(l.ks for l in weights), batch_size=int(x.shape[0]), extra_parameters=extra)
    report.flags = {
        "changed_architecture": bool(extra),
        "zero_weights": report.max_zero_share > MAX_ZERO_SHARE,
        "large_fc": report.widest_fc_ratio > MAX_FC_GROWTH * report.honest_widest_fc_ratio,
        "dominant_sample": report.max_sample_share > MAX_SAMPLE_SHARE_GROWTH * report.honest_max_sample_share,
        "silent_samples": report.silent_sample_share > MAX_SILENT_SAMPLES,
        "weight_statistics": report.max_ks > MAX_KS,
    }
    return report


def format_report(report: ModelReport, title: str) -> str:
    lines = [f"inspect-model: {title}  (batch of {report.batch_size}, input size {report.input_size})",
             f"{'layer':32s} {'zeros':>7s} {'std/honest':>10s} {'KS':>6s}"]
    for l in report.layers:
        if l.name.endswith("weight"):
            lines.append(f"{l.name:32s} {l.zero_share:7.1%} {l.std_ratio:10.3f} {l.ks:6.3f}")
    lines += [
        f"max zero share per layer     {report.max_zero_share:.1%}   (flag > {MAX_ZERO_SHARE:.0%})",
        f"widest FC / input size       {report.widest_fc_ratio:.3f}   honest {report.honest_widest_fc_ratio:.3f}",
        f"max one-sample gradient share {report.max_sample_share:.3f}  honest {report.honest_max_sample_share:.3f}"
        f"  (balanced = {1 / report.batch_size:.3f})",
        f"samples with ~zero gradient  {report.silent_sample_share:.1%}   "
        f"honest {report.honest_silent_sample_share:.1%}",
        f"max KS to honest weights     {report.max_ks:.3f}   (flag > {MAX_KS})",
        f"parameters without an honest counterpart: {', '.join(report.extra_parameters) or 'none'}",
        "flags: " + (", ".join(k for k, v in report.flags.items() if v) or "none")
        + ("  => SUSPICIOUS" if report.suspicious else "  => looks inconspicuous"),
    ]
    return "\n".join(lines)
