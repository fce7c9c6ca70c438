"""Issue 6's results table from a benchmark JSON, as Markdown.

    python -m benchmarks.report BENCH.json

One line per anchor row and dtype: cuTile's ssd_forward median (as called by default, and with
check_values=False: no host read of A and D), mamba_ssm's, flash-linear-attention's and the torch
baseline's from the same run, the speedups over mamba_ssm and over fla, the target and whether it is
met (by either call), % of the roofline floor, how the default call was timed ("latency": from an
idle GPU, host time included; "gpu, N starved": GPU time, N rounds of which waited for the host;
benchmarks/timing.py), and the per-kernel medians (their share of ssd_forward without the value read
in parentheses: the forward runs chunk_cumsum and either ssd_scan or fwd_pass_state and
compute_out).
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.configs import ANCHORS

KERNELS = ("chunk_cumsum", "ssd_scan", "fwd_pass_state", "compute_out")


def _ms(b) -> str:
    return "-" if b is None else f"{b['stats']['median'] * 1e3:.3f}"


def _timing(info: dict) -> str:
    if "timing" not in info and "starved_rounds" not in info:
        return "-"
    if info.get("timing", "gpu") == "latency":
        return "latency"
    return f"gpu, {info.get('starved_rounds', '?')} starved"


def table(benchmarks: list[dict]) -> str:
    found = {}
    for b in benchmarks:
        info = b.get("extra_info", {})
        if info.get("series") == "anchor":
            found[(info["row"], info["dtype"], info["op"], info["impl"])] = b
    if not found:
        raise ValueError("no anchor benchmark in the JSON")
    lines = ["| row | config | dtype | cuTile ms | cuTile ms, no value read | mamba_ssm ms "
             "| fla ms | torch ms | speedup | speedup, no value read | speedup over fla "
             "| target ms | met | % of floor | timing | " + " | ".join(KERNELS) + " |",
             "|" + "---|" * (14 + len(KERNELS))]
    for name, config in ANCHORS.items():
        for dtype in sorted({k[1] for k in found if k[0] == name}):
            ours = found.get((name, dtype, "ssd_forward", "cutile"))
            nocheck = found.get((name, dtype, "ssd_forward", "cutile_nocheck"))
            mamba = found.get((name, dtype, "ssd_forward", "mamba_ssm"))
            torch = found.get((name, dtype, "ssd_forward", "torch"))
            fla = found.get((name, dtype, "ssd_forward", "fla"))
            info = ours["extra_info"] if ours else {}
            speedup, speedup_nocheck = (
                f"{mamba['stats']['median'] / b['stats']['median']:.2f}x" if b and mamba else "-"
                for b in (ours, nocheck))
            over_fla = (f"{fla['stats']['median'] / ours['stats']['median']:.2f}x"
                        if ours and fla else "-")
            met = {True: "yes", False: "no"}.get(info.get("meets_target"), "-")
            if nocheck and "meets_target" in nocheck["extra_info"]:
                met += " / " + ("yes" if nocheck["extra_info"]["meets_target"] else "no")
            kernels = []
            for k in KERNELS:
                kb = found.get((name, dtype, k, "cutile"))
                share = kb["extra_info"].get("share_of_ssd_forward_pct") if kb else None
                kernels.append(_ms(kb) + ("" if share is None else f" ({share:.0f} %)"))
            pct = f"{info['pct_of_floor']:.0f}" if "pct_of_floor" in info else "-"
            lines.append(
                f"| {name} | {', '.join(map(str, config))} | {dtype} | {_ms(ours)} "
                f"| {_ms(nocheck)} | {_ms(mamba)} | {_ms(fla)} | {_ms(torch)} | {speedup} "
                f"| {speedup_nocheck} | {over_fla} | {info.get('target_ms', '-')} | {met} | {pct} "
                f"| {_timing(info)} | " + " | ".join(kernels) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("bench", help="pytest-benchmark JSON (from --benchmark-json=...)")
    args = parser.parse_args(argv)
    try:
        with open(args.bench) as f:
            print(table(json.load(f)["benchmarks"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
