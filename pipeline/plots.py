"""The audit's plots, as PNG files next to report.md: for each run, the latency CDF per mode,
the delivery rate over time with the faults marked, and the delivery gap per fault. matplotlib's
Agg backend: no display needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAULT_COLOURS = {
    "kill": "#d62728",
    "restart": "#2ca02c",
    "pause": "#ff7f0e",
    "partition": "#9467bd",
    "loss": "#8c564b",
    "dup": "#e377c2",
    "delay": "#7f7f7f",
}
MODE_COLOURS = {"reliable": "#1f77b4", "fire": "#ff7f0e"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def latency_cdf(report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, points in report["plots"]["latency_cdf"].items():
        if points:
            ax.step(
                [v * 1000 for _, v in points],
                [p / 100 for p, _ in points],
                where="post",
                label=f"{mode} (n={report['modes'][mode]['latency']['n']})",
                color=MODE_COLOURS.get(mode),
            )
    ax.set_xscale("log")
    ax.set_xlabel("one-way latency, publish to first delivery (ms, log scale)")
    ax.set_ylabel("fraction of deliveries")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Latency CDF per delivery mode: {report['run']['id']}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right")
    return _save(plt, fig, path)


def delivery_rate(report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    rate = report["plots"]["rate"]
    t0, width = rate["t0"], rate["bin"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for mode in ("reliable", "fire"):
        bins = rate[mode]
        if bins:
            xs = sorted(int(b) for b in bins)
            ax.plot(
                [b * width for b in xs],
                [bins[b] if b in bins else bins[str(b)] for b in xs],
                label=mode,
                color=MODE_COLOURS[mode],
                linewidth=1,
            )
    seen: set[str] = set()
    for f in report["faults"]:
        start = f["start"] - t0
        end = (f["end"] if f["end"] is not None else report["run"]["ended"] or f["start"]) - t0
        colour = FAULT_COLOURS.get(f["fault"], "#17becf")
        label = None if f["fault"] in seen else f"fault: {f['fault']}"
        seen.add(f["fault"])
        ax.axvspan(start, max(end, start + width / 2), alpha=0.15, color=colour, label=label)
        ax.axvline(start, color=colour, linewidth=0.8, alpha=0.8)
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("deliveries per second")
    ax.set_title(f"Delivery rate over time, faults shaded: {report['run']['id']}")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right", fontsize="small", ncol=2)
    return _save(plt, fig, path)


def fault_gaps(report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    faults = report["faults"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    t0 = report["plots"]["rate"]["t0"]
    labels = [f"{f['fault']} {f['target']}\n+{f['start'] - t0:.1f}s" for f in faults]
    xs = range(len(faults))
    ax.bar(
        [x - 0.2 for x in xs],
        [f["gap"] * 1000 for f in faults],
        width=0.4,
        label="longest gap on a path",
        color="#1f77b4",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [(f["recover"] or 0) * 1000 for f in faults],
        width=0.4,
        color="#444444",
        alpha=0.6,
        label="time to recover after the end",
    )
    ax.set_xticks(list(xs), labels, fontsize="x-small", rotation=60 if len(faults) > 12 else 0)
    ax.set_xlabel("fault (kind, target, start)")
    ax.set_ylabel("milliseconds")
    ax.set_title(f"Delivery gap and recovery per fault: {report['run']['id']}")
    ax.grid(True, axis="y", alpha=0.3)
    if faults:
        ax.legend(loc="upper right", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no faults in this run", ha="center", va="center", transform=ax.transAxes)
    return _save(plt, fig, path)


def draw_all(report: dict[str, Any], out: Path) -> list[Path]:
    rid = report["run"]["id"]
    return [
        latency_cdf(report, out / f"{rid}-latency-cdf.png"),
        delivery_rate(report, out / f"{rid}-rate.png"),
        fault_gaps(report, out / f"{rid}-fault-gaps.png"),
    ]
