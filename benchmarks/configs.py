"""The benchmarked shapes, as (batch, seqlen, nheads, headdim, dstate, ngroups, chunk_size).

ANCHORS: the spec's five rows ("Anchors measured on the H200"), with mamba_ssm's medians measured
there (ms; fp32, bf16) and issue 6's fp32 targets for ssd_forward (ms).
THREE_KERNEL_ROWS: shapes whose bfloat16 forward keeps chunk states (benchmarks.narrow).
SMALL_GRID_ROWS: float32 grids of under a wave of scan programs, where the forward's route is
decided (benchmarks.sweep --forward times every route).
SWEEP: the seqlen sweep behind the picture (Mamba-2 2.7B heads, batch 1).
row_inputs: a row's input arrays on the GPU.
"""

import math

from contract import Dims

ANCHORS = {
    "mamba2_2p7b": (4, 4096, 80, 64, 128, 1, 256),
    "long_seq": (1, 16384, 80, 64, 128, 1, 256),
    "mamba2_130m": (8, 2048, 24, 64, 128, 1, 256),
    "chunk_64": (4, 4096, 80, 64, 128, 1, 64),
    "groups_8": (4, 4096, 64, 64, 64, 8, 128),
}
SPEC_MAMBA_MS = {
    "mamba2_2p7b": (1.187, 0.693),
    "long_seq": (1.245, 0.721),
    "mamba2_130m": (0.840, 0.803),
    "chunk_64": (1.488, 0.884),
    "groups_8": (0.730, 0.565),
}
TARGET_FP32_MS = {
    "mamba2_2p7b": 0.36,
    "long_seq": 0.38,
    "mamba2_130m": 0.15,
    "chunk_64": 0.50,
    "groups_8": 0.25,
}

# shapes whose bfloat16 forward runs chunk_cumsum, fwd_pass_state and compute_out on an H200
# (a grid too small for the scan; benchmarks.narrow times their chunk states' dtype)
THREE_KERNEL_ROWS = {
    "b1_16k_h24": (1, 16384, 24, 64, 128, 1, 256),
    "b2_4k_h8_c128": (2, 4096, 8, 64, 128, 1, 128),
    "b1_16k_h32_c64": (1, 16384, 32, 64, 128, 1, 64),
    "b1_8k_h16": (1, 8192, 16, 64, 128, 1, 256),
    "b2_8k_h8_n64_c128": (2, 8192, 8, 64, 64, 1, 128),
    "b1_32k_h24": (1, 32768, 24, 64, 128, 1, 256),
}

# scan programs on an H200 (132 SMs): 80 (long_seq, an anchor), 96, and 128: the groups_8 layer's
# real call in benchmarks.client (D per head here)
SMALL_GRID_ROWS = {
    "b2_8k_h48": (2, 8192, 48, 64, 128, 1, 256),
    "groups_8_layer": (2, 4000, 64, 64, 64, 8, 128),
}

SWEEP_SEQLENS = (1024, 2048, 4096, 8192, 16384)


def sweep_config(seqlen: int) -> tuple[int, ...]:
    return (1, seqlen, 80, 64, 128, 1, 256)


SWEEP_TEXT = ", ".join(f"{k} {v}" for k, v in zip(
    ("batch", "nheads", "headdim", "dstate", "ngroups", "chunk_size"),
    sweep_config(0)[:1] + sweep_config(0)[2:]))


def row_inputs(config) -> dict:
    """The inputs of a benchmarked row, float32 CuPy arrays on the current device, drawn from a
    seed of the row (the timed benchmarks and the sweep time the same arrays): x, dt, A, B, C, D."""
    import cupy
    batch, seqlen, nheads, headdim, dstate, ngroups, chunk_size = config
    rng = cupy.random.default_rng(sum(config))
    f32 = cupy.float32
    return {
        "x": rng.standard_normal((batch, seqlen, nheads, headdim), dtype=f32),
        # processed step sizes, log-uniform in [1e-3, 1e-1] (Mamba-2's dt initialisation range)
        "dt": cupy.exp(rng.uniform(math.log(1e-3), math.log(1e-1),
                                   (batch, seqlen, nheads))).astype(f32),
        # decay rates in -[1, 16] (Mamba-2's A initialisation range)
        "A": -rng.uniform(1.0, 16.0, nheads).astype(f32),
        "B": rng.standard_normal((batch, seqlen, ngroups, dstate), dtype=f32),
        "C": rng.standard_normal((batch, seqlen, ngroups, dstate), dtype=f32),
        "D": rng.standard_normal(nheads, dtype=f32),
    }


def dims_of(config) -> Dims:
    """contract.Dims of a config tuple (note: Dims orders ngroups before dstate)."""
    batch, seqlen, nheads, headdim, dstate, ngroups, chunk_size = config
    return Dims(batch=batch, seqlen=seqlen, nheads=nheads, headdim=headdim, ngroups=ngroups,
                dstate=dstate, chunk_size=chunk_size)
