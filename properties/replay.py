"""Replay reproducers: run each stored example's property on its stored inputs.

    python -m properties.replay .fuzz/causal_prefix.npz [more.npz ...] [--backend gpu]
    python -m properties.replay properties/reproducers/*.npz

Prints PASS or FAIL (with the property's message) per file; exits 1 if any fails. `--mutant
NAME` replays inside a copy of the tree with that catalogue bug planted (how a reproducer of a
planted failure is shown to reproduce).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def replay(paths: list[Path], backend: str) -> int:
    from properties.checks import run
    from properties.strategies import Problem

    failed = 0
    for path in paths:
        name, problem = Problem.load(path)
        try:
            metrics = run(name, problem, backend)
        except AssertionError as e:
            failed += 1
            print(f"FAIL {path} [{name}, {backend}]\n{e}\n", flush=True)
            continue
        detail = ", ".join(f"{k} {v:.3g}" for k, v in metrics.items())
        print(f"PASS {path} [{name}, {backend}] {detail}", flush=True)
    print(f"{len(paths) - failed} of {len(paths)} reproducers pass")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--backend", choices=("auto", "gpu", "interpreter"), default="auto")
    parser.add_argument("--mutant", help="replay with this catalogue bug planted")
    args = parser.parse_args(argv)
    if args.mutant:
        from properties.mutants import run_planted
        return run_planted(args.mutant, ["-m", "properties.replay", "--backend", args.backend,
                                         *(str(p.resolve()) for p in args.paths)])
    from properties.runner import resolve_backend
    return replay(args.paths, resolve_backend(args.backend))


if __name__ == "__main__":
    sys.exit(main())
