"""Regression gate: compare two pytest-benchmark JSON files, fail when a median got slower.

    python -m benchmarks.compare BASELINE.json CURRENT.json [--threshold 0.10]
                                 [--latency-threshold 0.40] [--retry RETRY.json ...]

Gated: the project's own benchmarks (extra_info impl "cutile": ssd_forward as called by default
and each kernel; "cutile_nocheck": ssd_forward with check_values=False), matched by test id
(fullname). A gated benchmark regresses when its current median exceeds (1 + threshold) x its
baseline median, where the threshold of a latency (`extra_info['timing'] == "latency"`: the
default call, whose value read synchronises with the host, timed from an idle GPU with the
host's whole call in it) is --latency-threshold: latencies of unchanged code move by far more
than GPU times between runs, so a 10 % gate on them would fail at random, while a host path that
got slower by half must not pass (benchmarks/DECISIONS.md, "Benchmark method").

A latency holds the host's Python, whose speed is the process's and the moment's. So a latency
that regressed can be measured again in other processes (`--retry`: the JSON of a rerun of those
rows, from the same commit; `python -m properties.gate` reruns them LATENCY_RETRIES times), and
is then judged by the median of its medians over the current run and the retries that have it:
one slow process does not fail the gate, one fast process does not pass a host path that got
slower. GPU-time rows are not retried: their medians stay within a few % between runs.

A gated benchmark of the baseline that is missing from
the current run (it failed, errored or was skipped) also fails the gate, and so does one timed
by another method in the two files (`extra_info['timing']`, benchmarks/timing.py; files from
before that key are all "gpu"): its medians measure different things, so the baseline must be
re-measured. Benchmarks new in the current run and the comparators (torch, mamba_ssm) are
listed, never gated.

Why not pytest-benchmark's own `--benchmark-compare-fail=median:10%`: that reruns the benchmarks
against its storage folder and gates every benchmark alike; this command compares two stored
files anywhere (a CPU review machine too), gates only the project's implementations (a slower
comparator is not a regression of ours), and fails on a gated benchmark that went missing.

Exit status: 0 no regression, 1 a regression or a missing benchmark, 2 unusable input (a file,
retries included, that is not pytest-benchmark JSON; a retry from another commit than the
current run's; or no gated benchmark in common: a gate that compares nothing must not pass).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

# ours: ssd_forward as called by default and the kernels, ssd_forward without the value read
OUR_IMPLS = ("cutile", "cutile_nocheck")
LATENCY_THRESHOLD = 0.40  # above the run-to-run moves of unchanged code (DECISIONS.md)
LATENCY_RETRIES = 2  # reruns of a regressed latency in fresh processes: a median of three
FAILED = ("MISSING", "REGRESSION", "METHOD")  # how the status of a failed row starts


def load(path: str, commit: bool = False):
    """Benchmarks of a pytest-benchmark JSON file, by fullname; with `commit`, (that, the
    commit id pytest-benchmark recorded, or None)."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ValueError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    benchmarks = {b["fullname"]: b for b in data["benchmarks"]}
    return (benchmarks, _commit(data)) if commit else benchmarks


def _timing(bench: dict) -> str:
    return bench.get("extra_info", {}).get("timing", "gpu")


def _ours(bench: dict) -> bool:
    return bench.get("extra_info", {}).get("impl") in OUR_IMPLS


def compare(baseline: dict[str, dict], current: dict[str, dict], threshold: float,
            latency_threshold: float = LATENCY_THRESHOLD, retries: list[dict[str, dict]] = ()):
    """(rows, failures): one row per benchmark (name, baseline ms, current ms, change, status).
    `retries`: runs measured after `current` (load()ed); a latency that regressed in `current`
    is judged by the median of its medians there and in the retries that have it."""
    rows, failures = [], []
    for name in sorted(set(baseline) | set(current)):
        base, cur = baseline.get(name), current.get(name)
        gated = _ours(base or cur)
        allowed = latency_threshold if _timing(base or cur) == "latency" else threshold
        base_ms = base["stats"]["median"] * 1e3 if base else None
        cur_ms = cur["stats"]["median"] * 1e3 if cur else None
        change = cur_ms / base_ms - 1.0 if base and cur else None
        if base is None:
            status = "new"
        elif cur is None:
            status = "MISSING" if gated else "missing (not gated)"
        elif not gated:
            status = "not gated"
        elif _timing(base) != _timing(cur):
            status = f"METHOD {_timing(base)} -> {_timing(cur)}"
        elif change > allowed:
            status = "REGRESSION"
            if _timing(base) == "latency" and retries:
                status = _over_retries(name, base, cur_ms / base_ms, retries, allowed)
        else:
            status = "ok"
        if status.startswith(FAILED):
            failures.append(name)
        rows.append((name, base_ms, cur_ms, change, status))
    return rows, failures


def _over_retries(name: str, base: dict, ratio: float, retries, allowed: float) -> str:
    """The status of latency row `name`, `ratio` times its baseline median in the current run,
    from the median of that ratio and the row's in each retry that has it (timed alike)."""
    ratios = [ratio] + [again["stats"]["median"] / base["stats"]["median"]
                        for again in (retry.get(name) for retry in retries)
                        if again is not None and _timing(again) == _timing(base)]
    if len(ratios) == 1:
        return "REGRESSION (in no retry)"
    change = statistics.median(ratios) - 1.0
    verdict = "ok" if change <= allowed else "REGRESSION"
    return f"{verdict}: median of {len(ratios)} runs {change:+.1%}"


def latency_regressions(baseline: dict[str, dict], rows) -> list[str] | None:
    """The rows of compare() to measure again: its failures when every one is a latency that
    regressed, else None (a missing row, another timing method or a GPU-time regression fails
    whatever a rerun of the latencies gives)."""
    failed = [(name, status) for name, _, _, _, status in rows if status.startswith(FAILED)]
    latencies = [name for name, status in failed
                 if status.startswith("REGRESSION") and _timing(baseline[name]) == "latency"]
    return latencies if latencies and len(latencies) == len(failed) else None


def _commit(data: dict) -> str | None:
    return (data.get("commit_info") or {}).get("id")


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("baseline", help="pytest-benchmark JSON of the baseline run")
    parser.add_argument("current", help="pytest-benchmark JSON of the run to check")
    parser.add_argument("--threshold", type=float, default=0.10,
                        help="largest allowed slowdown of a median, as a fraction (default 0.10)")
    parser.add_argument("--latency-threshold", type=float, default=LATENCY_THRESHOLD,
                        help="the same for a latency (the default call, host time included; "
                             f"default {LATENCY_THRESHOLD})")
    parser.add_argument("--retry", action="append", default=[], metavar="RETRY.json",
                        help="a later run of regressed latency rows, from the current run's "
                             "commit (repeatable): such a row is judged by the median of its "
                             "runs")
    args = parser.parse_args(argv)
    for name in ("threshold", "latency_threshold"):
        if not getattr(args, name) >= 0.0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    try:
        baseline = load(args.baseline)
        current, commit = load(args.current, commit=True)
        retries = []
        for path in args.retry:
            retry, retry_commit = load(path, commit=True)
            if commit and retry_commit and retry_commit != commit:
                raise ValueError(f"{path}: a retry of commit {retry_commit}, not of the current "
                                 f"run's {commit}")
            retries.append(retry)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    common = [n for n in baseline if n in current and _ours(baseline[n])]
    if not common:
        print("compare: no gated (impl 'cutile' or 'cutile_nocheck') benchmark is in both "
              "files; nothing to compare", file=sys.stderr)
        return 2
    rows, failures = compare(baseline, current, args.threshold, args.latency_threshold, retries)
    width = max(len(r[0]) for r in rows)
    print(f"{'benchmark':<{width}}  {'base ms':>9}  {'now ms':>9}  {'change':>8}  status")
    for name, base_ms, cur_ms, change, status in rows:
        print(f"{name:<{width}}  {_fmt(base_ms, '9.4f')}  {_fmt(cur_ms, '9.4f')}  "
              f"{_fmt(change, '+8.1%')}  {status}")
    if failures:
        print(f"\n{len(failures)} gated benchmark(s) regressed by more than "
              f"{100 * args.threshold:.0f}% (a latency by more than "
              f"{100 * args.latency_threshold:.0f}%), are missing, or were timed by another "
              f"method than the baseline's (METHOD: re-measure the baseline)"
              + ("; a latency with retries is judged by the median of its runs"
                 if retries else ""), file=sys.stderr)
        return 1
    print(f"\nno gated benchmark regressed by more than {100 * args.threshold:.0f}% (a latency by "
          f"more than {100 * args.latency_threshold:.0f}%) "
          f"({len(common)} compared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
