"""The benchmark plot (docs/img/benchmarks.png): panels one under the other, drawn with matplotlib's Agg backend."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

COLOURS = {
    "reference": "#9e9e9e",
    "ws": "#1f77b4",
    "http+poll": "#ff7f0e",
    "inproc": "#2ca02c",
    "floor": "#555555",
    "ref-to-ours": "#9467bd",
    "ours-to-ref": "#8c564b",
    "ws-sync": "#17becf",
    "reference-sync": "#d62728",
    "ws-to-trio": "#bcbd22",
    "ws-trio-to-trio": "#e377c2",
}


# The figure is read in the docs page's column (about 750 px wide): it is drawn that wide
# (7.5 in), one panel per row, text at FONT points (12 to 14 px on the page), and saved at
# twice that (DPI: 1500 px), sharp in the full-size view the page links to. Each panel is a
# subfigure whose legend sits under it, outside the axes, so a legend never hides data and
# constrained layout keeps every label in the frame.
WIDTH = 7.5
DPI = 200
FONT = 10
_LABEL_CHARS = 34  # a bar's label wraps past this, so the bars keep most of the width
_TITLE_CHARS = 80
_LINE_HEIGHT = 0.19  # inches per line of text at FONT - 1 points, with its spacing
_LINE_PANEL_HEIGHT = 3.6  # inches of plot in a line panel
_PANEL_MARGIN = 1.0  # inches of title, axis label and spacing per panel


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def _lines(text: str) -> int:
    return text.count("\n") + 1


def _legend_height(labels: list[str], columns: int) -> float:
    rows = -(-len(labels) // columns)
    return rows * _LINE_HEIGHT * max((_lines(label) for label in labels), default=1) + 0.2


def _title(panel: Any, title: str) -> None:
    """A panel's title, over its whole width (the axes of a bar panel start after the labels)."""
    panel.suptitle(_wrap(title, _TITLE_CHARS), x=0.01, ha="left", fontsize=FONT + 1)


def _legend_below(panel: Any, handles: list[Any], columns: int) -> None:
    """The panel's legend, under it and outside its axes: it never hides the data."""
    panel.legend(handles=handles, loc="outside lower center", ncol=columns, fontsize=FONT - 1, frameon=False)


def _bar_panel(labels: list[str], groups: list[str]) -> tuple[list[str], float]:
    """The wrapped labels of a bar panel, and its height in inches."""
    wrapped = [_wrap(label, _LABEL_CHARS) for label in labels]
    bars = sum(max(_lines(label), 1) * _LINE_HEIGHT + 0.08 for label in wrapped)
    legend = _legend_height(list(dict.fromkeys(groups)), columns=6)
    return wrapped, bars + legend + _PANEL_MARGIN


def _bars(
    panel: Any,
    labels: list[str],
    values: list[float],
    groups: list[str],
    title: str,
    unit: str,
    suffix: str = "",
) -> Any:
    from matplotlib.patches import Patch

    axes = panel.subplots()
    positions = range(len(labels))
    axes.set_xlim(0, max(values, default=1.0) * 1.15)  # room for the figures after the bars
    axes.barh(positions, values, color=[COLOURS.get(group, "#777777") for group in groups])
    axes.set_yticks(list(positions), labels, fontsize=FONT - 1)
    axes.set_ylim(len(labels) - 0.5, -0.5)  # the first bar on top
    _title(panel, title)
    axes.set_xlabel(unit, fontsize=FONT - 1)
    axes.tick_params(axis="x", labelsize=FONT - 1)
    for position, value in zip(positions, values, strict=True):
        axes.text(value, position, f" {value:.2f}{suffix}" if value < 10 else f" {value:,.0f}{suffix}", va="center",
                  fontsize=FONT - 1)  # fmt: skip
    shown = list(dict.fromkeys(groups))
    _legend_below(panel, [Patch(color=COLOURS.get(group, "#777777"), label=group) for group in shown], len(shown))
    return axes


def plot(results: dict[str, Any], path: Path) -> None:
    """Draw the echo ratios, the large-observation throughput and the scale curves into ``path``, one per row."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    from matplotlib import pyplot
    from matplotlib.ticker import FuncFormatter, NullFormatter

    medians = {row["key"]: row["median"] for row in results["echo"] if row["median"]}

    def reference_of(row: dict[str, Any]) -> str:
        """The reference pair with the same kind of environment: the row's own (a reference), or its versus."""
        if row["group"] == "reference":
            return str(row["key"])
        refs = [key for key in row.get("versus", []) if key.startswith("ref")]
        return refs[0] if refs else "ref-async"  # the floors: against the faster reference

    echo = [row for row in results["echo"] if row["median"] and medians.get(reference_of(row))]
    blob = [row for row in results["blob"] if row["median"]]
    targets = list(dict.fromkeys(row["target"] for row in results["scale"] if row["steps_per_second"]))
    series = {
        target: [row for row in results["scale"] if row["target"] == target and row["steps_per_second"]]
        for target in targets
    }
    series_labels = [_wrap(rows[0]["label"], _LABEL_CHARS) for rows in series.values()]

    echo_labels, echo_height = _bar_panel(
        [row["label"] + ("  [÷ async ref]" if row["group"] == "floor" else "") for row in echo],
        [row["group"] for row in echo],
    )
    blob_labels, blob_height = _bar_panel([row["label"] for row in blob], [row["group"] for row in blob])
    scale_height = _LINE_PANEL_HEIGHT + _PANEL_MARGIN
    legend_height = _legend_height(series_labels, columns=2)
    heights = [echo_height, blob_height, scale_height, scale_height + legend_height]
    title = "openenv vs the reference (openenv-core 0.3.0) and the raw floors"
    if results["meta"]["quick"]:
        title += "\n[QUICK SMOKE RUN: not for comparison]"
    figure = pyplot.figure(figsize=(WIDTH, sum(heights) + 0.6), layout="constrained")
    figure.suptitle(title, fontsize=FONT + 3)
    panels: Any = figure.subfigures(4, 1, height_ratios=heights)  # an array of 4
    echo_panel, blob_panel, rate_panel, p99_panel = panels

    echo_axes = _bars(
        echo_panel,
        echo_labels,
        [row["median"] / medians[reference_of(row)] for row in echo],
        [row["group"] for row in echo],
        "One session, small frames: steps/s ÷ the reference pair with the same kind of env (sync or async)",
        "x the reference (1 = as fast)",
        suffix="x",
    )
    echo_axes.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    _bars(
        blob_panel,
        blob_labels,
        [row["median"] * row["payload_bytes"] / 1e6 for row in blob],
        [row["group"] for row in blob],
        f"{results['meta']['blob_bytes'] / 2**20:g} MiB observation per step: MB/s of payload",
        "MB/s (10⁶ bytes of decoded payload per second)",
    )

    rate_axes, p99_axes = rate_panel.subplots(), p99_panel.subplots()
    for (target, rows), label in zip(series.items(), series_labels, strict=True):
        sessions = [row["sessions"] for row in rows]
        colour = COLOURS.get(target, "#777777")
        rate_axes.plot(sessions, [row["steps_per_second"] for row in rows], "o-", color=colour, label=label)
        p99_axes.plot(sessions, [row["p99_ms"] for row in rows], "o-", color=colour, label=label)
    counts = sorted({row["sessions"] for row in results["scale"]})
    for axes, label in ((rate_axes, "aggregate steps/s"), (p99_axes, "p99 step latency, ms (log scale)")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(counts, [str(count) for count in counts])
        axes.minorticks_off()
        axes.set_xlabel("concurrent sessions against one server process", fontsize=FONT - 1)
        axes.set_ylabel(label, fontsize=FONT - 1)
        axes.tick_params(labelsize=FONT - 1)
        axes.grid(True, which="both", alpha=0.3)
    rate_axes.set_ylim(bottom=0)
    p99_axes.set_yscale("log")
    p99_axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 0.1, not 0
    p99_axes.yaxis.set_minor_formatter(NullFormatter())
    _title(rate_panel, "Scale: aggregate steps/s (the legend is under the next panel)")
    _title(p99_panel, "Scale: p99 latency")
    # The two scale panels draw the same series: one legend, under the second.
    _legend_below(p99_panel, p99_axes.get_legend_handles_labels()[0], columns=2)

    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    pyplot.close(figure)
