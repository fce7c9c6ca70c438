"""Nightly fuzzing: every property for a time budget with the `nightly` profile.

    python -m properties.fuzz --minutes 30 --backend gpu --out .fuzz/

Round-robin over the properties, `--round` examples per property at a time (generate and target
phases: hypothesis.target climbs toward the worst bound ratio), until the budget is spent. The
example database lives in OUT/hypothesis-db: keep OUT between nights and the failures and the
best-targeted examples of the last night run first. Every failure is shrunk and written as a
self-contained reproducer, OUT/<property>.npz (all inputs, the options, the property's
parameters) with OUT/<property>.txt (the failure and the exact replay command,
`python -m properties.replay OUT/<property>.npz --backend ...`). Prints a summary (examples run,
worst err/(u*M) and err/bound per property), writes it to OUT/summary.json, exits 1 if anything
failed.

`--mutant NAME` plants a bug of the catalogue (properties/mutants.py) first: the demonstration
that the fuzzer finds, shrinks and writes a failure that the replayer reproduces.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path


def fuzz(minutes: float, backend: str, out: Path, names: list[str], per_round: int,
         planted: str | None) -> int:
    from hypothesis import given, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    from properties.checks import PROPERTIES
    from properties.profiles import register_profiles

    register_profiles()
    out.mkdir(parents=True, exist_ok=True)
    base = settings(settings.get_profile("nightly"), max_examples=per_round,
                    database=DirectoryBasedExampleDatabase(str(out / "hypothesis-db")),
                    report_multiple_bugs=False)
    deadline = time.time() + 60.0 * minutes
    examples = {n: 0 for n in names}
    worst: dict[str, dict[str, float]] = {n: {} for n in names}
    failures: dict[str, str] = {}
    rounds = 0
    while time.time() < deadline and len(failures) < len(names):
        rounds += 1
        for name in names:
            if name in failures or time.time() >= deadline:
                continue
            last = {}
            test = base(given(PROPERTIES[name].strategy())(
                _body(name, backend, last, examples, worst[name])))
            try:
                test()
            except Exception as e:
                if "problem" not in last:  # the harness itself broke: not a kernel failure
                    raise
                # the shrunk failure: its example ran last
                failures[name] = _write_reproducer(out, name, last["problem"], e, backend,
                                                   planted)
                print(f"FAIL {name}: reproducer {failures[name]}", flush=True)
    summary = _summary(examples, worst, failures, rounds, minutes, backend, planted)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 1 if failures else 0


def _body(name: str, backend: str, last: dict, examples: dict, worst: dict):
    """The test body of property `name`: counts examples, keeps the last problem, targets and
    records the metrics."""
    from hypothesis import target

    from properties.checks import run

    def body(problem):
        examples[name] += 1
        last["problem"] = problem
        for label, value in run(name, problem, backend).items():
            target(value, label=label)
            worst[label] = max(worst.get(label, 0.0), value)

    # the example database is keyed by the test function's name: one per property
    body.__name__ = body.__qualname__ = f"fuzz_{name}_{backend}"
    return body


def _write_reproducer(out: Path, name: str, problem, error: BaseException, backend: str,
                      planted: str | None) -> str:
    path = out / f"{name}.npz"
    problem.save(path, name)
    command = f"python -m properties.replay {path} --backend {backend}"
    if planted:
        command += f" --mutant {planted}"
    text = "".join(traceback.format_exception_only(type(error), error))
    (out / f"{name}.txt").write_text(f"property: {name}\nreplay: {command}\n\n{text}")
    return command


def _summary(examples, worst, failures, rounds, minutes, backend, planted) -> dict:
    def top(kind):
        values = [v for w in worst.values() for k, v in w.items() if k.endswith(kind)]
        return max(values, default=0.0)
    return {
        "backend": backend, "minutes": minutes, "rounds": rounds, "planted_mutant": planted,
        "examples": sum(examples.values()), "examples_per_property": examples,
        "worst_err_over_uM": top("err/(u*M)"), "worst_err_over_bound": top("err/bound"),
        "worst_per_property": worst, "failures": failures,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--backend", choices=("auto", "gpu", "interpreter"), default="auto")
    parser.add_argument("--out", type=Path, default=Path(".fuzz"))
    parser.add_argument("--properties", nargs="*", help="names (default: all)")
    parser.add_argument("--round", type=int, default=50, help="examples per property per round")
    parser.add_argument("--mutant", help="plant this catalogue bug first (a demonstration)")
    parser.add_argument("--planted", help=argparse.SUPPRESS)  # set by --mutant's re-run
    args = parser.parse_args(argv)
    if args.mutant:
        from properties.mutants import run_planted
        rest = ["-m", "properties.fuzz", "--minutes", str(args.minutes), "--backend",
                args.backend, "--out", str(args.out.resolve()), "--round", str(args.round),
                "--planted", args.mutant]
        if args.properties:
            rest += ["--properties", *args.properties]
        return run_planted(args.mutant, rest)
    os.environ["HYPOTHESIS_PROFILE"] = "nightly"  # the strategies' size caps follow it
    from properties.checks import PROPERTIES, resolve_backend
    names = args.properties or list(PROPERTIES)
    unknown = sorted(set(names) - set(PROPERTIES))
    if unknown:
        parser.error(f"unknown properties {unknown}; known: {sorted(PROPERTIES)}")
    return fuzz(args.minutes, resolve_backend(args.backend), args.out, names, args.round,
                args.planted)


if __name__ == "__main__":
    sys.exit(main())
