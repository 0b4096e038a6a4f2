"""The fleet plot (docs/img/fleet.png): steps/s against sessions, async echo and plain echo side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Each line: how it is drawn. Shared connections solid, a connection per session dashed, the reference grey.
_STYLES = {
    "reference": {"color": "#777777", "linestyle": "-", "marker": "s", "linewidth": 2.5},
    "ws-pool-shared": {"color": "#1f77b4", "linestyle": "-", "marker": "o"},
    "ws-pool-own": {"color": "#1f77b4", "linestyle": "--", "marker": "o"},
    "ws-pool-shared-unbound": {"color": "#d62728", "linestyle": "-", "marker": "o"},
    "ws-clients-shared": {"color": "#ff7f0e", "linestyle": "-", "marker": "^"},
    "ws-clients-own": {"color": "#ff7f0e", "linestyle": "--", "marker": "^"},
    "ws-pool-recv-shared": {"color": "#17becf", "linestyle": "-", "marker": "D"},
    "poll-pool-shared": {"color": "#9467bd", "linestyle": "-", "marker": "o"},
    "poll-pool-own": {"color": "#9467bd", "linestyle": "--", "marker": "o"},
    "poll-clients-shared": {"color": "#8c564b", "linestyle": "-", "marker": "^"},
    "poll-clients-own": {"color": "#8c564b", "linestyle": "--", "marker": "^"},
    "inproc-pool": {"color": "#2ca02c", "linestyle": ":", "marker": "o"},
    "inproc-clients": {"color": "#2ca02c", "linestyle": ":", "marker": "^"},
}


def _style(target: str, env: str) -> dict[str, Any]:
    return _STYLES.get(target.removesuffix(f"-{env}"), {"color": "#000000", "linestyle": "-", "marker": "x"})


def plot(results: dict[str, Any], path: Path) -> None:
    """Draw each fleet row's steps/s against its session count, a panel per kind of echo, into ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    from matplotlib import pyplot
    from matplotlib.ticker import ScalarFormatter

    rows = [row for row in results["fleet"]["rows"] if row.get("steps_per_second")]
    figure, panels = pyplot.subplots(1, 2, figsize=(15, 8), sharey=True)
    title = "Fleets: aggregate steps/s of N sessions from one process, against one server"
    if results["meta"].get("quick"):
        title += "  [QUICK SMOKE RUN: not for comparison]"
    figure.suptitle(title, fontsize=12)
    counts = sorted({row["sessions"] for row in results["fleet"]["rows"]})
    for axes, env in zip(panels, ("async", "plain"), strict=True):
        mine = [row for row in rows if row["env"] == env]
        for target in dict.fromkeys(row["target"] for row in mine):
            line = [row for row in mine if row["target"] == target]
            axes.plot([row["sessions"] for row in line], [row["steps_per_second"] for row in line],
                      label=line[0]["label"].removesuffix(f" ({env} echo)"), **_style(target, env))  # fmt: skip
        axes.set_title(f"{env} echo ({'async def step' if env == 'async' else 'def step'})", fontsize=10)
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xticks(counts, [f"{count:,}" for count in counts])
        axes.minorticks_off()
        axes.yaxis.set_major_formatter(ScalarFormatter())
        axes.set_xlabel("sessions opened from one process", fontsize=8)
        axes.tick_params(labelsize=8)
        axes.grid(True, which="both", alpha=0.3)
        if mine:  # below the panel: the lines stay clear
            axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    panels[0].set_ylabel("aggregate steps/s (log)", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
