"""Hypothesis profiles of the property suite and the size caps that go with each.

`conftest.py` registers and loads them; `python -m properties.fuzz` loads `nightly` itself and
`python -m properties.mutants` runs the suite with `mutants` (the ci examples, no shrinking).
Which profile: $HYPOTHESIS_PROFILE if set, else `ci` where CI is set (CI=true), else `dev`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from contract import CHUNK_SIZES
from kernels.chunk_cumsum import RULES_BLOCK_H
from kernels.compute_out import MAX_BLOCK_P
from kernels.fwd_pass_state import RULES_BLOCK_N

# Where the nightly profile keeps its example database (failures found at night replay first
# the next night; the fuzz command points it into its output folder).
NIGHTLY_DATABASE = ".hypothesis/nightly"


@dataclass(frozen=True)
class Caps:
    """The largest sizes a profile draws (the interpreter is Python: small on the CPU).

    Wide examples (where `wide_cost` > 0) reach past the kernels' largest tiles cheaply: nheads,
    headdim and dstate up to the wide_* caps, with seqlen at most `wide_seqlen` and batch x
    wide_seqlen x nheads x headdim x dstate at most `wide_cost`. `reach`: the reach check
    (properties/reach.py) holds a run of the whole suite to every class of launch these caps
    allow. `gpu_buckets`: where the properties run on the GPU (`backend()`), each strategy draws
    its examples' sizes and options from this many fixed buckets (`strategies.Bucket`), so that
    the kernels' specializations, each a compile of about a second, repeat across examples; the
    interpreter compiles nothing, and there every example draws its own."""

    batch: int
    seqlen: int
    nheads: int
    headdim: int
    dstate: int
    chunk_sizes: tuple[int, ...] = CHUNK_SIZES
    wide_nheads: int = 0
    wide_headdim: int = 0
    wide_dstate: int = 0
    wide_seqlen: int = 0
    wide_cost: int = 0
    reach: bool = False
    gpu_buckets: int = 0


# past the kernels' largest tiles: a second head block of chunk_cumsum (16 heads), a third,
# partial headdim block (64 columns) and a second, partial dstate block of fwd_pass_state
# (128); dstate past 128 also halves compute_out's token block
WIDE = dict(wide_nheads=RULES_BLOCK_H + 4, wide_headdim=2 * MAX_BLOCK_P + 17,
            wide_dstate=RULES_BLOCK_N + 17, wide_seqlen=80, wide_cost=80 * 4 * 64 * 128)
# buckets per strategy on the GPU: benchmarks/DECISIONS.md, "Property suite: GPU buckets"
GPU_BUCKETS = 2
CAPS = {
    "dev": Caps(batch=2, seqlen=200, nheads=4, headdim=32, dstate=32),
    "ci": Caps(batch=2, seqlen=300, nheads=4, headdim=64, dstate=64, **WIDE, reach=True,
               gpu_buckets=GPU_BUCKETS),
    "nightly": Caps(batch=3, seqlen=1100, nheads=8, headdim=128, dstate=128, **WIDE),
}
CAPS["mutants"] = CAPS["ci"]

# Slow-by-design tests (reference runs in float64, several kernel runs per example).
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]


def register_profiles():
    """Register `dev`, `ci` and `nightly` with Hypothesis (idempotent)."""
    settings.register_profile(
        "dev", max_examples=10, deadline=None, suppress_health_check=_SLOW_OK)
    # derandomized: the same examples on every run, so CI is reproducible; no database, so a
    # runner's leftovers cannot change what runs; bounded: the whole suite in a few minutes
    settings.register_profile(
        "ci", max_examples=100, derandomize=True, database=None, deadline=None,
        print_blob=True, suppress_health_check=_SLOW_OK)
    # the mutant runner (properties/mutants.py): the ci examples; a mutant is killed by the
    # first failing example, so no shrinking
    settings.register_profile(
        "mutants", settings.get_profile("ci"),
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target))
    settings.register_profile(
        "nightly", max_examples=400, deadline=None, print_blob=True,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
        database=DirectoryBasedExampleDatabase(NIGHTLY_DATABASE),
        suppress_health_check=_SLOW_OK)


def profile_name() -> str:
    """The profile to load: $HYPOTHESIS_PROFILE, else `ci` under CI, else `dev`."""
    name = os.environ.get("HYPOTHESIS_PROFILE")
    if name:
        if name not in CAPS:
            raise ValueError(f"HYPOTHESIS_PROFILE must be one of {sorted(CAPS)}, got {name!r}")
        return name
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return "ci"
    return "dev"


def caps() -> Caps:
    """The size caps of the active profile."""
    return CAPS[profile_name()]


# where the property suite runs its kernels: conftest.py sets it from --backend and the machine
BACKEND_VARIABLE = "CUTILE_SSD_BACKEND"


def backend() -> str:
    """'gpu' or 'interpreter': $CUTILE_SSD_BACKEND (unset: 'interpreter')."""
    name = os.environ.get(BACKEND_VARIABLE, "interpreter")
    if name not in ("gpu", "interpreter"):
        raise ValueError(f"{BACKEND_VARIABLE} must be 'gpu' or 'interpreter', got {name!r}")
    return name


def buckets() -> int:
    """The buckets the strategies draw sizes and options from (0: none, every example its own):
    the profile's `gpu_buckets` where the backend is the GPU."""
    return caps().gpu_buckets if backend() == "gpu" else 0
