"""Writes the results: a Markdown report (goals first, then one table per measurement) and a PNG chart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .common import Panel, Section, Stat, Table


def markdown(sections: list[Section], header: list[str]) -> str:
    out = ["# detlaunch benchmarks", "", *header, "", "## Goals", "",
           "| goal | target | measured | met |", "|---|---|---|---|"]
    for section in sections:
        for g in section.goals:
            met = "n/a" if g.met is None else ("yes" if g.met else "**no**")
            out.append(f"| {g.what} | {g.target} | {g.measured} | {met} |")
    for section in sections:
        for table in section.tables:
            out += ["", *_table(table)]
    return "\n".join(out) + "\n"


def _table(t: Table) -> list[str]:
    lines = [f"## {t.title}", "", "| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in t.rows]
    if t.notes:
        lines += [""] + [f"- {note}" for note in t.notes]
    return lines


def chart(sections: list[Section], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for s in sections for p in s.panels]
    if not panels:
        return
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(8 * cols, 4.8 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        if panel.series is not None:
            _lines(ax, panel)
        else:
            _bars(ax, panel)
        ax.set_title(panel.title, fontsize=11)
        ax.set_ylabel(panel.ylabel)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("detlaunch vs its peers (median, whiskers: min-max over repetitions)", fontsize=13)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _err(stats: list[Stat | None]) -> tuple[list[float], list[list[float]]]:
    medians = [s.median if s else math.nan for s in stats]
    spread = [[s.median - s.lo if s else 0.0 for s in stats], [s.hi - s.median if s else 0.0 for s in stats]]
    return medians, spread


def _bars(ax: Any, panel: Panel) -> None:
    medians, spread = _err(panel.stats)
    colors = ["tab:blue" if "detlaunch" in label else "tab:gray" for label in panel.labels]
    ax.bar(range(len(medians)), medians, yerr=spread, capsize=3, color=colors)
    ax.set_xticks(range(len(medians)), panel.labels, rotation=30, ha="right", fontsize=8)
    for i, m in enumerate(medians):
        if not math.isnan(m):
            ax.annotate(f"{m:.2f}", (i, m), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
    if panel.goal is not None:
        ax.axhline(panel.goal, color="tab:red", linestyle="--", linewidth=1, label=f"goal {panel.goal:g}")
        ax.legend(fontsize=8)


def _lines(ax: Any, panel: Panel) -> None:
    assert panel.series is not None and panel.x is not None
    for name, stats in panel.series.items():
        medians, spread = _err(stats)
        ax.errorbar(panel.x, medians, yerr=spread, marker="o", capsize=3, label=name)
    ax.set_xticks(panel.x, [f"{x:g}" for x in panel.x])  # a linear axis: linear growth is a straight line
    ax.set_xlabel("ranks")
    ax.legend(fontsize=8)
