"""The table of shapes and options the kernel tests run, in one place, and its input maker.

Every stage test (tests/test_chunk_cumsum.py, test_fwd_pass_state.py, test_compute_out.py,
test_ssd_scan.py, test_ssd_forward.py) runs these cases on both backends: "interpreter" (NumPy
inputs, the CPU tile interpreter) and "gpu" (CuPy inputs, marker gpu). A case's id says what it
is for.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field

import numpy as np
import pytest

from properties.bounds import U_TF32
from properties.runner import to_host
from properties.strategies import to_backend


@dataclass(frozen=True)
class Case:
    id: str
    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int
    # options: D None/"head"/"channel"; dt "plain" (processed dt = raw dt) or "softplus" (dt_bias,
    # softplus, an active dt_limit); seq_idx None/"sorted"/"arbitrary" (ids that come back)
    D: str | None = None
    z: bool = False
    dt: str = "plain"
    initial_states: bool = False
    seq_idx: str | None = None
    marks: tuple = field(default=())  # e.g. (pytest.mark.slow,)

    def param(self):
        return pytest.param(self, id=self.id, marks=self.marks)


ALL_OPTIONS = dict(D="channel", z=True, dt="softplus", initial_states=True, seq_idx="arbitrary")

CASES = [
    Case("base_chunk64", 2, 256, 4, 64, 1, 64, 64),
    # every chunk size, seqlen not a multiple of it (a short last chunk)
    Case("chunk16_ragged", 1, 53, 2, 16, 1, 16, 16),
    Case("chunk32_ragged", 1, 77, 2, 32, 1, 32, 32),
    Case("chunk64_ragged", 2, 150, 2, 32, 1, 32, 64),
    Case("chunk128_ragged", 1, 300, 2, 64, 1, 64, 128),
    Case("chunk256_ragged", 1, 600, 2, 64, 1, 128, 256),
    Case("seqlen_chunk_plus_1", 1, 65, 2, 16, 1, 16, 64),
    Case("seqlen_below_chunk", 1, 50, 2, 16, 1, 32, 256),
    Case("seqlen_1", 2, 1, 3, 16, 1, 16, 64),
    Case("seqlen_1_all_options", 1, 1, 2, 8, 1, 8, 16, **ALL_OPTIONS),
    # groups: head h reads group h // (nheads // ngroups)
    Case("ngroups_2_of_8", 1, 96, 8, 16, 2, 16, 32),
    Case("ngroups_eq_nheads", 1, 64, 4, 16, 4, 16, 16),
    # two heads per compute_out program (float32, chunk of several token blocks), two programs
    # per group, two groups
    Case("ngroups_2_of_8_chunk128", 1, 200, 8, 16, 2, 16, 128),
    # headdim / dstate not powers of two, tiny, and spanning several tiles
    Case("headdim_1_dstate_1", 1, 40, 2, 1, 1, 1, 16),
    Case("headdim_3_dstate_5", 1, 40, 2, 3, 1, 5, 16),
    Case("headdim_80_dstate_200", 1, 70, 2, 80, 1, 200, 32),
    Case("headdim_100_dstate_17", 1, 70, 2, 100, 1, 17, 64),
    Case("headdim_256_dstate_256", 1, 80, 1, 256, 1, 256, 64),
    # several headdim and dstate blocks where fwd_pass_state may run its chunks in parallel
    Case("headdim_100_dstate_200_chunk128", 1, 300, 2, 100, 1, 200, 128, initial_states=True,
         seq_idx="sorted"),
    # every option on its own, then all together
    Case("D_per_head", 1, 100, 4, 16, 1, 16, 32, D="head"),
    Case("D_per_channel", 1, 100, 4, 16, 1, 16, 32, D="channel"),
    Case("z_gate", 1, 100, 4, 16, 1, 16, 32, z=True),
    Case("dt_bias_softplus_limit", 1, 100, 4, 16, 1, 16, 32, dt="softplus"),
    Case("initial_states", 2, 100, 4, 16, 1, 16, 32, initial_states=True),
    Case("seq_idx_sorted", 2, 150, 2, 16, 1, 16, 32, seq_idx="sorted"),
    Case("seq_idx_arbitrary", 2, 150, 2, 16, 1, 16, 32, seq_idx="arbitrary"),
    Case("seq_idx_with_initial_states", 1, 150, 2, 16, 1, 16, 64, initial_states=True,
         seq_idx="sorted"),
    Case("all_options_chunk256", 2, 300, 4, 24, 2, 40, 256, **ALL_OPTIONS),
    Case("all_options_chunk16", 1, 70, 4, 8, 2, 8, 16, **ALL_OPTIONS),
    # every option but seq_idx where a chunk holds several token blocks of dstate 100 (a tile of
    # 128) and headdim 100 (two blocks of 64): what compute_out's program per chunk takes
    Case("options_but_seq_idx_headdim_100_dstate_100", 1, 300, 4, 100, 2, 100, 256,
         D="channel", z=True, dt="softplus", initial_states=True),
    # many programs: batch * nheads = 1024
    Case("batch_x_nheads_1024", 8, 32, 128, 16, 8, 16, 16),
    # the Mamba-2 2.7B layout, shortened: headdim 64, dstate 128, 80 heads, chunk 256
    Case("mamba2_2p7b_layout", 1, 512, 80, 64, 1, 128, 256, D="head",
         marks=(pytest.mark.slow,)),
]


BACKENDS = [
    pytest.param("interpreter", id="interpreter"),
    pytest.param("gpu", id="gpu", marks=pytest.mark.gpu),
]


def make_inputs(case: Case, seed: int = 0) -> dict:
    """Random float32 inputs of `case` (NumPy), as keyword arguments of ssd_forward; none zero.

    dt "plain": processed dt = raw dt in [1e-3, 0.3] (log-uniform), A in [-8, -0.5]: in-chunk
    decays from negligible to 2^-3000-small, the exponents the kernels must handle.
    """
    rng = np.random.default_rng(seed)
    b, L, h, p, g, n = case.batch, case.seqlen, case.nheads, case.headdim, case.ngroups, case.dstate
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    kw = dict(x=f32(rng.standard_normal((b, L, h, p))),
              B=f32(rng.standard_normal((b, L, g, n))),
              C=f32(rng.standard_normal((b, L, g, n))),
              A=f32(-np.exp(rng.uniform(math.log(0.5), math.log(8.0), h))),
              chunk_size=case.chunk_size)
    if case.dt == "plain":
        kw["dt"] = f32(np.exp(rng.uniform(math.log(1e-3), math.log(0.3), (b, L, h))))
    else:  # softplus(dt + dt_bias) from ~e^-6 to 25 (v > 20 included), clamped at both ends
        dt = rng.normal(-2.0, 2.0, (b, L, h))
        dt[:, ::17] = 25.0
        kw.update(dt=f32(dt), dt_bias=f32(rng.normal(0.0, 1.0, h)), dt_softplus=True,
                  dt_limit=(0.01, 1.5))
    if case.D == "head":
        kw["D"] = f32(rng.standard_normal(h))
    elif case.D == "channel":
        kw["D"] = f32(rng.standard_normal((h, p)))
    if case.z:
        kw["z"] = f32(rng.standard_normal((b, L, h, p)))
    if case.initial_states:
        kw["initial_states"] = f32(rng.standard_normal((b, h, p, n)))
    if case.seq_idx == "sorted":
        kw["seq_idx"] = np.sort(rng.integers(0, max(2, L // 40), (b, L)), axis=1).astype(np.int32)
    elif case.seq_idx == "arbitrary":  # runs of random ids, ids coming back, a run of length 1
        runs = np.repeat(rng.integers(0, 3, (b, L)), rng.integers(1, 30, L), axis=1)[:, :L]
        runs[:, L // 2] = 7
        kw["seq_idx"] = runs.astype(np.int32)
    return kw


def step_options(kw: dict) -> dict:
    """The dt processing options of make_inputs' `kw` (dt_bias, dt_softplus, dt_limit), as
    keyword arguments of chunk_cumsum and its reference."""
    return {k: kw[k] for k in ("dt_bias", "dt_softplus", "dt_limit") if k in kw}


def on_backend(backend: str, arrays: dict) -> dict:
    """`arrays` with every NumPy array moved to the backend's array type (CuPy for "gpu", torch
    CUDA tensors for "torch": properties.strategies.to_backend, bfloat16 as its bits)."""
    if backend == "interpreter":
        return dict(arrays)  # as they are: strided views stay views
    return {k: to_backend(v, backend) if isinstance(v, np.ndarray) else v
            for k, v in arrays.items()}


def check_within(name: str, got, ref, M, kappa: float, test_id: str, extra=0.0):
    """Assert |got - ref| <= kappa * U_TF32 * M + extra per element (NaN fails), and log the
    worst err / (U_TF32 * M) to $SSD_ERR_LOG when set (a GPU run keeps it with its results).

    `extra`: the bounds module's terms outside the relative count (decay_term, ftz_floor)."""
    got = to_host(got).astype(np.float64)
    err = np.abs(got - ref)
    bound = kappa * U_TF32 * M + extra
    bad = ~(err <= bound)  # NaN in got fails too
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(M > 0, err / (U_TF32 * M), np.where(err > 0, np.inf, 0.0))
    worst = float(np.nanmax(ratio)) if ratio.size else 0.0
    if os.environ.get("SSD_ERR_LOG"):
        with open(os.environ["SSD_ERR_LOG"], "a") as f:
            f.write(f"{test_id}\t{name}\t{worst:.4f}\n")
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {bad.size} elements outside {kappa:.3g} u M; worst "
        f"err/(u M) = {worst:.4g}; NaN in result: {int(np.isnan(got).sum())}")
    return worst


def launch_arg(kernel, args: tuple, name: str):
    """The value a launch passes for the kernel parameter `name` (e.g. "BLOCK_K")."""
    import inspect
    return dict(zip(inspect.signature(kernel._pyfunc).parameters, args, strict=True))[name]


@contextlib.contextmanager
def recorded_launches():
    """Within the block, every launch of the launchers is recorded as (kernel function name,
    kernel, args), in order, and still run."""
    from kernels.arrays import Backend
    launches = []
    original = Backend.launch

    def launch(self, kernel, grid, args, *stream):
        launches.append((kernel._pyfunc.__name__, kernel, args))
        return original(self, kernel, grid, args, *stream)

    Backend.launch = launch
    try:
        yield launches
    finally:
        Backend.launch = original
