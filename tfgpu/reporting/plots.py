"""The run report's PNG plots, drawn from the run's metric declarations (``tfgpu.metrics.metric_specs``).

Each declared ``plot`` is one figure, ``<model_dir>/plots/<plot>.png``; metrics that share a ``panel`` share
an axis. No pyplot: no global backend, no GUI, safe in any process. Each PNG is drawn into memory and written
with ``fileio.atomic_write_bytes``, so ``model_dir`` may be any path TensorFlow opens.
"""
import io
import math
import statistics

from tfgpu.runtime import fileio
from tfgpu.runtime.fileio import atomic_write_bytes
from tfgpu.runtime import run_dir

PLOTS_DIR = run_dir.PLOTS_DIR


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def series(records: list, key: str) -> tuple:
    """(steps, values) of ``key`` over ``records``, skipping records without a finite value."""
    points = [(r["step"], r[key]) for r in records if _finite(r.get(key))]
    return [p[0] for p in points], [float(p[1]) for p in points]


def _png(figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def figures(specs) -> list:
    """The plots the declarations ask for, in declaration order: [(plot, title, [(panel y label, scale, style,
    [(record kind, key, legend label)])])]. A figure's title is the first one declared for it."""
    by_plot, seen = {}, set()
    for spec in specs:
        if not spec.plot or spec.style == "image" or (spec.kind, spec.name) in seen:
            continue
        seen.add((spec.kind, spec.name))
        figure = by_plot.setdefault(spec.plot, {"title": "", "panels": {}})
        figure["title"] = figure["title"] or spec.title
        panel = figure["panels"].setdefault(spec.panel, {"scale": spec.scale, "style": spec.style, "lines": []})
        panel["lines"].append((spec.kind, spec.name, spec.label or spec.name))
    return [(plot, figure["title"] or plot, [(ylabel, p["scale"], p["style"], p["lines"])
                                             for ylabel, p in figure["panels"].items()])
            for plot, figure in by_plot.items()]


def write_plots(model_dir: str, history: dict, specs) -> list:
    """Writes every declared plot that has data to ``<model_dir>/plots/<plot>.png``; returns [(relative path,
    title)]."""
    written = []
    for plot, title, panels in figures(specs):
        drawn = []
        for ylabel, scale, style, lines in panels:
            present = [(label, *series(history.get(kind, []), key)) for kind, key, label in lines]
            present = [(label, steps, values) for label, steps, values in present if steps]
            if present:
                drawn.append((ylabel, scale, style, present))
        if not drawn:
            continue
        figure = _figure(len(drawn))
        axes = figure.subplots(len(drawn), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (ylabel, scale, style, present) in zip(axes, drawn):
            if style == "rate":
                _draw_throughput(ax, *present[0])
            else:
                for (label, steps, values), linestyle in zip(present, ("-", "--", ":")):  # equal series stay visible
                    ax.plot(steps, values, linestyle=linestyle, marker="o" if len(steps) <= 30 else None,
                            markersize=3, label=label)
                if len(present) > 1:
                    ax.legend(fontsize=8)
            if scale == "log" and _spans_decades(present):
                ax.set_yscale("log")
            elif scale == "log":
                ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 4))
            elif scale == "log2":
                ax.set_yscale("log", base=2)  # e.g. dynamic loss scales: powers of two
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
        axes[-1].set_xlabel("step")
        axes[0].set_title(title)
        path = run_dir.plot_name(plot)
        fileio.makedirs(run_dir.plots(model_dir))
        atomic_write_bytes(run_dir.plot(model_dir, plot), _png(figure))
        written.append((path, title))
    return written


def _figure(num_panels: int):
    """A figure of ``num_panels`` stacked panels with margins fixed in inches: room for a title, a y label with
    8-character tick labels and the x label. Fixed, because a layout engine measures every text first
    ("constrained" took about half of the report's 1.7 s at the end of every run on a 2-core CPU)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend, no GUI, safe in any process

    width, height = 7.5, 2.6 + 1.9 * num_panels
    figure = Figure(figsize=(width, height), dpi=100)
    figure.subplots_adjust(left=1.0 / width, right=1 - 0.15 / width, top=1 - 0.4 / height, bottom=0.55 / height,
                           hspace=0.2)
    return figure


def _draw_throughput(ax, label, steps, values):
    """The loops after the first as a line from 0 up, with their median; the first loop (tracing and
    compilation) as a separate marker whose value is in the legend even when it is off the scale."""
    if len(steps) > 1:
        ax.plot(steps[1:], values[1:], marker="o" if len(steps) <= 30 else None, markersize=3, label=label)
        median = statistics.median(values[1:])
        ax.axhline(median, color="grey", linestyle="--", linewidth=1, label=f"median {median:,.4g}")
        ax.set_ylim(0, max(values[1:]) * 1.3)
    ax.plot(steps[:1], values[:1], marker="x", linestyle="none", color="tab:red", markersize=7,
            label=f"first loop (may include tracing and compilation): {values[0]:,.4g}")
    if len(steps) == 1:
        ax.set_ylim(0, values[0] * 1.3)
    ax.legend(fontsize=8, loc="lower right")


def _spans_decades(present) -> bool:
    """True for positive values over more than two decades: a log axis shows all of them."""
    values = [v for _, _, vs in present for v in vs]
    return len(values) > 1 and min(values) > 0 and max(values) / min(values) > 100
