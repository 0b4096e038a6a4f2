"""The benchmark plot (docs/img/benchmarks.png): four panels drawn with matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {
    "reference": "#9e9e9e",
    "reference-0.3": "#cfcfcf",
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


def _bars(
    axes: Any,
    labels: list[str],
    values: list[float],
    groups: list[str],
    title: str,
    unit: str,
    suffix: str = "",
    legend: str = "best",
) -> None:
    from matplotlib.patches import Patch

    positions = range(len(labels))
    axes.set_xlim(0, max(values, default=1.0) * 1.15)  # room for the figures after the bars
    axes.barh(positions, values, color=[COLOURS.get(group, "#777777") for group in groups])
    axes.set_yticks(list(positions), labels, fontsize=7)
    axes.invert_yaxis()
    axes.set_title(title, fontsize=10)
    axes.set_xlabel(unit, fontsize=8)
    axes.tick_params(axis="x", labelsize=8)
    for position, value in zip(positions, values, strict=True):
        axes.text(value, position, f" {value:.2f}{suffix}" if value < 10 else f" {value:,.0f}{suffix}", va="center",
                  fontsize=7)  # fmt: skip
    shown = dict.fromkeys(groups)
    axes.legend(
        handles=[Patch(color=COLOURS.get(group, "#777777"), label=group) for group in shown],
        fontsize=7,
        loc=legend,
    )


def plot(results: dict[str, Any], path: Path) -> None:
    """Draw the echo ratios, the scale curves and the large-observation throughput into ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    from matplotlib import pyplot
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    figure, ((echo_axes, blob_axes), (rate_axes, p99_axes)) = pyplot.subplots(2, 2, figsize=(15, 10))
    title = f"openenv vs the reference ({results['meta'].get('reference', 'openenv-core 0.3.0')}) and the raw floors"
    if results["meta"]["quick"]:
        title += "  [QUICK SMOKE RUN: not for comparison]"
    figure.suptitle(title, fontsize=12)

    echo = [row for row in results["echo"] if row["median"]]
    medians = {row["key"]: row["median"] for row in echo}

    def reference_of(row: dict[str, Any]) -> str:
        """The reference pair with the same kind of environment: the row's own (a reference), or its versus."""
        if row["group"] == "reference":
            return str(row["key"])
        refs = [key for key in row.get("versus", []) if key.startswith("ref")]
        return refs[0] if refs else "ref-async"  # the floors: against the faster reference

    echo = [row for row in echo if medians.get(reference_of(row))]
    _bars(
        echo_axes,
        [row["label"] + ("  [÷ async ref]" if row["group"] == "floor" else "") for row in echo],
        [row["median"] / medians[reference_of(row)] for row in echo],
        [row["group"] for row in echo],
        "One session, small frames: steps/s ÷ the reference pair with the same kind of env (sync or async)",
        "x the reference (1 = as fast)",
        suffix="x",
        legend="center right",
    )
    echo_axes.axvline(1.0, color="black", linewidth=0.8, linestyle="--")

    blob = [row for row in results["blob"] if row["median"]]
    _bars(
        blob_axes,
        [row["label"] for row in blob],
        [row["median"] * row["payload_bytes"] / 1e6 for row in blob],
        [row["group"] for row in blob],
        f"{results['meta']['blob_bytes'] / 2**20:g} MiB observation per step: MB/s of payload",
        "MB/s (10⁶ bytes of decoded payload per second)",
        legend="upper right",
    )

    for target in dict.fromkeys(row["target"] for row in results["scale"]):
        rows = [row for row in results["scale"] if row["target"] == target and row["steps_per_second"]]
        if not rows:
            continue
        sessions = [row["sessions"] for row in rows]
        colour = COLOURS.get(target, "#777777")
        rate_axes.plot(sessions, [row["steps_per_second"] for row in rows], "o-", color=colour, label=rows[0]["label"])
        p99_axes.plot(sessions, [row["p99_ms"] for row in rows], "o-", color=colour, label=rows[0]["label"])
    counts = sorted({row["sessions"] for row in results["scale"]})
    for axes, label in ((rate_axes, "aggregate steps/s"), (p99_axes, "p99 step latency, ms")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(counts, [str(count) for count in counts])
        axes.minorticks_off()
        axes.set_xlabel("concurrent sessions against one server process", fontsize=8)
        axes.set_ylabel(label, fontsize=8)
        axes.tick_params(labelsize=8)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7, loc="upper left")  # both panels are empty there
    p99_axes.set_yscale("log")
    p99_axes.yaxis.set_major_formatter(ScalarFormatter())
    p99_axes.yaxis.set_minor_formatter(NullFormatter())
    rates = [row["steps_per_second"] for row in results["scale"] if row["steps_per_second"]]
    # Headroom above the curves for the legend, which would hide the top one.
    rate_axes.set_ylim(bottom=0, top=max(rates, default=1.0) * 1.5)
    p99s = [row["p99_ms"] for row in results["scale"] if row["p99_ms"]]
    p99_axes.set_ylim(top=max(p99s, default=1.0) * 30)  # a decade and a half of log scale for the legend
    rate_axes.set_title("Scale: aggregate steps/s", fontsize=10)
    p99_axes.set_title("Scale: p99 latency", fontsize=10)

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
