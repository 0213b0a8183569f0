"""The report's plots (matplotlib, written as PNG files beside index.html)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..analysis import SCENARIO_KEYS, setting_name


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


def _tradeoff_plot(entries: list[dict], path: Path, title: str) -> bool:
    """The verdict's own measure against the cost: utility loss (x, with its 95% interval)
    against the deciding attack's linkage AUC (y, with its 95% interval), each point named by its
    setting; the tolerance's linkage bound (dashed), the utility budget where the study set one
    (dotted), chance (AUC 0.5), and the frontier's settings ringed and joined."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [e for e in entries if e.get("ev_examples") and e.get("ev_linkage") is not None]
    if not points:
        return False
    with_utility = all(e.get("utility_loss") is not None for e in points)
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=100)
    colours = {d: f"C{i % 10}" for i, d in enumerate(sorted({str(e["defense"]) for e in points}))}
    labelled: set[str] = set()
    xs = []
    for i, e in enumerate(points):
        x = e["utility_loss"] if with_utility else float(i)
        xs.append(x)
        y = e["ev_linkage"]
        defense = str(e["defense"])
        ax.errorbar([x], [y], xerr=[e.get("utility_loss_ci") or 0.0] if with_utility else None,
                    yerr=[[max(y - e["ev_linkage_low"], 0.0)], [max(e["ev_linkage_high"] - y, 0.0)]],
                    fmt="X" if e.get("unusable") else "o", ms=5, lw=0.9, capsize=2, color=colours[defense],
                    label=None if defense in labelled else defense)
        labelled.add(defense)
    # names above and below their points in turn, left to right: neighbours' names do not overprint
    for turn, (x, e) in enumerate(sorted(zip(xs, points), key=lambda pair: pair[0])):
        name = setting_name(e) + (" (unusable)" if e.get("unusable") else "")
        ax.annotate(name, (x, e["ev_linkage"]), fontsize=7, xytext=(4, 4 if turn % 2 == 0 else -11),
                    textcoords="offset points")
    frontier = sorted((e for e in points if e.get("frontier")), key=lambda e: e["utility_loss"])
    if with_utility and frontier:
        ax.plot([e["utility_loss"] for e in frontier], [e["ev_linkage"] for e in frontier], "o-", ms=13, mfc="none",
                mec="k", color="k", lw=0.6, label="frontier")
    tolerance = next((e["tolerance"]["linkage"] for e in points if isinstance(e.get("tolerance"), dict)
                      and e["tolerance"].get("linkage") is not None), None)
    if tolerance is not None:
        ax.axhline(tolerance, color="#c62828", ls="--", lw=1, label=f"tolerance: linkage AUC ≤ {tolerance:g}")
    ax.axhline(0.5, color="#999", ls="-", lw=0.6, label="chance (AUC 0.5)")
    budget = next((e["utility_budget"] for e in points if e.get("utility_budget") is not None), None)
    if with_utility and budget is not None:
        ax.axvline(budget, color="#1565c0", ls=":", lw=1.2, label=f"utility budget: loss ≤ {budget:g}")
    lows = [e["ev_linkage_low"] for e in points] + [tolerance or 0.5]
    ax.set_ylim(min(0.45, min(lows) - 0.03), 1.02)
    if with_utility:
        ax.set_xlabel(f"utility loss ({points[0].get('utility_metric')}; 95% interval)")
    else:
        ax.set_xticks(xs, [setting_name(e) for e in points], rotation=30, fontsize=7, ha="right")
        ax.set_xlabel("defense setting (utility unknown: the utility model did not train)"
                      if any(e.get("utility_note") for e in points)
                      else "defense setting (no utility runs in this store)")
    ax.set_ylabel("linkage AUC of the deciding attack (95% interval)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def tradeoff_figures(entries: list[dict], out: Path) -> list[Figure]:
    """One trade-off plot per scenario (the ones with linkage evidence to plot)."""
    scenarios: dict[tuple, list[dict]] = defaultdict(list)
    for e in entries:
        scenarios[tuple(e[k] for k in SCENARIO_KEYS)].append(e)
    figures = []
    for i, (key, members) in enumerate(scenarios.items()):
        name = f"tradeoff-{i}.png"
        if _tradeoff_plot(members, out / name, _scenario_title(key)):
            figures.append(Figure(name, f"trade-off {i}", _scenario_title(key)))
    return figures
