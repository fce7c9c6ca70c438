"""The picture: ssd_forward's median time against seqlen and on the spec's anchor rows.

    python -m benchmarks.plot BENCH.json -o plot.png

Reads pytest-benchmark JSON written by tests/test_benchmarks.py and draws, from its ssd_forward
benchmarks, three panels with matplotlib (the `bench` extra: pip install -e ".[bench]"):
the seqlen sweep's median time (log-log), the anchor rows' median times (log time; one marker
series per implementation and dtype), and the sweep's % of the roofline floor (perf_model's
floor / measured time x 100, as recorded in extra_info). Colour tells the implementation, line
style and marker the dtype.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import TYPE_CHECKING

from benchmarks.configs import ANCHORS, SWEEP_TEXT
from benchmarks.perf_model import BANDWIDTH, PEAK_FLOPS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 120
FIGSIZE = (16.0, 6.0)  # inches
COLORS = {"cutile": "#1f77b4", "cutile_nocheck": "#7fb2dc", "mamba_ssm": "#ff7f0e",
          "torch": "#2ca02c"}
OTHER_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f")  # implementations not listed above
DTYPE_STYLES = {"float32": ("-", "o"), "bfloat16": ("--", "s"), "float16": (":", "^")}
OTHER_DTYPE_STYLE = ("-.", "D")
ANCHOR_SPREAD = 0.6  # of the gap between two anchor rows, shared by their marker series

Series = dict[tuple[str, str], list[tuple[int, float]]]


def load(path: str) -> list[dict]:
    """The benchmarks of a pytest-benchmark JSON file; ValueError when it is not one."""
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ValueError(f"{path} is not pytest-benchmark JSON (no 'benchmarks' list)")
    return data["benchmarks"]


def series(benchmarks: list[dict], kind: str, value: str = "ms") -> Series:
    """{(impl, dtype): [(x, y)]} of the ssd_forward benchmarks of `kind` ("sweep": x is the seqlen;
    "anchor": x is the anchor row's number), y the median in ms or (value="pct_of_floor") the
    recorded % of the roofline floor; benchmarks without that record are left out."""
    out: Series = {}
    for b in benchmarks:
        info = b.get("extra_info", {})
        if info.get("op") != "ssd_forward" or info.get("series") != kind:
            continue
        if value == "ms":
            y = b["stats"]["median"] * 1e3
        elif value in info:
            y = float(info[value])
        else:
            continue
        x = int(info["config"][1]) if kind == "sweep" else int(info["anchor"])
        out.setdefault((info["impl"], info["dtype"]), []).append((x, y))
    return {k: sorted(v) for k, v in sorted(out.items())}


def timings(benchmarks: list[dict]) -> dict[str, str]:
    """{impl: how its ssd_forward was timed} for implementations not timed as GPU time (the
    default cuTile forward synchronises on the host, so it is timed as a latency)."""
    return {b["extra_info"]["impl"]: b["extra_info"]["timing"] for b in benchmarks
            if b.get("extra_info", {}).get("op") == "ssd_forward"
            and b["extra_info"].get("timing", "gpu") != "gpu"}


def seqlen_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def figure(benchmarks: list[dict]) -> Figure:
    """The matplotlib Figure of the three panels (time sweep, anchor rows, % of floor); ValueError
    when the benchmarks hold no ssd_forward sweep or anchor result."""
    sweep, anchors = series(benchmarks, "sweep"), series(benchmarks, "anchor")
    if not sweep and not anchors:
        raise ValueError("no ssd_forward sweep or anchor benchmark in the JSON")
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

    impls = sorted({impl for impl, _ in [*sweep, *anchors]})
    others = itertools.cycle(OTHER_COLORS)
    color = {impl: COLORS.get(impl) or next(others) for impl in impls}
    timed = timings(benchmarks)

    def style(key):
        impl, dtype = key
        line, marker = DTYPE_STYLES.get(dtype, OTHER_DTYPE_STYLE)
        note = f" ({timed[impl]})" if impl in timed else ""
        return {"color": color[impl], "linestyle": line, "marker": marker,
                "label": f"{impl} {dtype}{note}"}

    # the anchor panel is wider: its tick labels carry the row names
    fig, (ax_time, ax_rows, ax_floor) = plt.subplots(1, 3, figsize=FIGSIZE, dpi=DPI,
                                                     width_ratios=(1.0, 1.2, 1.0))
    fig.suptitle("Mamba-2 SSD forward (ssd_forward): median time per call, L2 flushed before "
                 "every round", fontsize=13)

    def sweep_axes(ax, data, title, ylabel):
        """A seqlen-sweep panel: log2 x with a tick at each seqlen, one line per series."""
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        seqlens = sorted({x for pts in data.values() for x, _ in pts})
        ax.xaxis.set_major_locator(FixedLocator(seqlens))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([seqlen_label(n) for n in seqlens])
        ax.set_xlabel("seqlen (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, color="0.88")
        for key, pts in data.items():
            ax.plot(*zip(*pts), markersize=5, **style(key))
        if not data:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="0.5")

    def log_time_axis(ax):
        """Log y with ticks at 1, 2, 5 x 10^k written as plain numbers."""
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_locator(NullLocator())

    sweep_axes(ax_time, sweep, "seqlen sweep: time", "median time (ms, log)")
    log_time_axis(ax_time)
    sweep_axes(ax_floor, series(benchmarks, "sweep", "pct_of_floor"),
               "seqlen sweep: % of the roofline floor",
               "% of the roofline floor (floor / time x 100)")
    ax_floor.set_ylim(bottom=0)

    # the anchor rows: categorical x; each series sits at its own offset within a row's slot so
    # that equal times stay visible
    ax_rows.set_title("spec anchor rows: time")
    log_time_axis(ax_rows)
    names = list(ANCHORS)
    numbers = sorted({x for pts in anchors.values() for x, _ in pts})
    ax_rows.set_xticks(numbers, [f"{i}\n{names[i - 1]}" if 0 < i <= len(names) else str(i)
                                 for i in numbers], fontsize=9)
    ax_rows.set_xlabel("anchor row")
    ax_rows.set_ylabel("median time (ms, log)")
    ax_rows.grid(True, axis="y", color="0.88")
    for j, (key, pts) in enumerate(anchors.items()):
        offset = ANCHOR_SPREAD * ((j + 0.5) / len(anchors) - 0.5)
        ax_rows.plot([x + offset for x, _ in pts], [ms for _, ms in pts], linestyle="none",
                     markersize=6, **{k: v for k, v in style(key).items() if k != "linestyle"})
    if not anchors:
        ax_rows.text(0.5, 0.5, "no data", transform=ax_rows.transAxes, ha="center", color="0.5")

    # one legend for the three panels: the union of their series, in sorted order
    handles = {}
    for ax in (ax_time, ax_rows, ax_floor):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    labels = sorted(handles)
    fig.legend([handles[k] for k in labels], labels, loc="lower center", ncol=min(len(labels), 4),
               bbox_to_anchor=(0.5, 0.1), frameon=False, fontsize=10)
    notes = [f"Sweep: {SWEEP_TEXT}.  Anchor rows, as (batch, seqlen, nheads, headdim, dstate, "
             "ngroups, chunk_size):",
             "; ".join(f"{i} {name} {ANCHORS[name]}" for i, name in enumerate(ANCHORS, 1)) + ".",
             "Roofline floor = max(FLOP / peak, bytes / bandwidth), H200 ceilings "
             f"{PEAK_FLOPS['float32'] / 1e12:g} TFLOP/s TF32, "
             f"{PEAK_FLOPS['bfloat16'] / 1e12:g} TFLOP/s bf16, {BANDWIDTH / 1e12:g} TB/s "
             "(benchmarks/perf_model.py).  Times from CUDA events; (latency): from an idle GPU, "
             "host synchronisation included."]
    for k, note in enumerate(reversed(notes)):
        fig.text(0.01, 0.012 + 0.03 * k, note, fontsize=9)
    fig.subplots_adjust(left=0.05, right=0.99, top=0.89, bottom=0.33, wspace=0.22)
    return fig


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend; ImportError naming the extra to
    install when matplotlib is missing (it is optional: only this command needs it)."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError('the plot needs matplotlib: pip install -e ".[bench]"') from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("bench", help="pytest-benchmark JSON (from --benchmark-json=...)")
    parser.add_argument("-o", "--output", default="plot.png", help="the PNG (default plot.png)")
    args = parser.parse_args(argv)
    try:
        fig = figure(load(args.bench))
    except KeyError as e:
        print(f"plot: {args.bench}: an ssd_forward benchmark lacks {e}", file=sys.stderr)
        return 2
    except (ImportError, OSError, ValueError, TypeError) as e:
        print(f"plot: {e}", file=sys.stderr)
        return 2
    fig.savefig(args.output, dpi=DPI)
    width, height = (round(v * DPI) for v in fig.get_size_inches())
    pyplot().close(fig)
    print(f"wrote {args.output} ({width}x{height})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
