"""The report's plots (matplotlib, written as PNG files beside index.html)."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..analysis import SCENARIO_KEYS
from ..modalities import stored_modality


@dataclass
class Figure:
    src: str
    alt: str
    caption: str | None = None


def _scenario_title(key: tuple) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in zip(SCENARIO_KEYS, key))


def plot_rounds(rows: list[dict], path: Path, pictures: set[str]) -> bool:
    """PSNR of each attack per server round (mean over audited clients), over the rows of
    cells whose data are pictures (their keys: `pictures`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_attack: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["key"] in pictures:
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


def _tradeoff_plot(entries: list[dict], path: Path, title: str, by_psnr: bool) -> bool:
    """Utility loss (x) against the best attack's PSNR (y, dB, linear: higher = more leaked)
    for pictures (`by_psnr`); other data by the best MSE on a log axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [e for e in entries if e.get("psnr" if by_psnr else "mse") is not None]
    if not points:
        return False

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


def tradeoff_figures(entries: list[dict], out: Path, modalities: dict[str, str]) -> list[Figure]:
    """One trade-off plot per scenario (the ones with something to plot); `modalities`: each
    dataset's modality."""
    scenarios: dict[tuple, list[dict]] = defaultdict(list)
    for e in entries:
        scenarios[tuple(e[k] for k in SCENARIO_KEYS)].append(e)
    figures = []
    for i, (key, members) in enumerate(scenarios.items()):
        name = f"tradeoff-{i}.png"
        kind = stored_modality(modalities.get(str(key[SCENARIO_KEYS.index("dataset")])))
        if _tradeoff_plot(members, out / name, _scenario_title(key), kind.plotted_by == "psnr"):
            figures.append(Figure(name, f"trade-off {i}", _scenario_title(key)))
    return figures


