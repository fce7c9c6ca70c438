"""FLOP and byte counts of the SSD forward and of each kernel, and the H200 roofline floor.

Counting rules (written once, used by every benchmark):

FLOP: the multiply-adds of the matrix products, 2 FLOP each; elementwise work (exp2, the
cumulative sum, the skip term, the gate) is not counted: it is orders below either ceiling.
For a chunk of Q tokens (the last chunk may be shorter; the sums below run over the actual
chunk lengths Q_c, so sum(Q_c) = seqlen):

    CB^T         per (batch, chunk, group):  Q_c x Q_c x dstate      -> 2 b g n sum(Q_c^2)
                 (the whole square: the kernel forms it before the causal mask)
    (CB^T o L)(dt X), causal half only:      Q_c^2/2 x headdim       -> b h p sum(Q_c^2)
    chunk states X^T (B o w):                headdim x dstate x Q_c  -> 2 b h p n seqlen
    carried term C S^T:                      Q_c x headdim x dstate  -> 2 b h p n seqlen
    state passing S <- 2^a S + new:          headdim x dstate per chunk -> 2 b h p n nchunks

(b = batch, h = nheads, p = headdim, n = dstate, g = ngroups.)  On the spec's first anchor
(4, 4096, 80, 64, 128, 1, 256) this gives 65.6 GFLOP, 65.5 without the state passing: the spec's
"~65.5 GFLOP of useful work".

Bytes: compulsory traffic, each tensor read or written once at its storage width: x, B, C, z
and y at the input width (4 B for fp32, 2 B for bf16/fp16); dt, A, D, dt_bias and the states at
4 B (issue 6 item 4: those stay fp32). For ssd_forward: read x, dt, A, B, C (+ D, z) and write y
(+ final_states when returned). The spec's "~0.69 GB" for the first anchor is x + dt + B + C + y
(0.693 GB); with final_states, which the anchors return, it is 0.704 GB.
Per kernel, its own inputs and outputs (so the kernels together move more than ssd_forward's
compulsory traffic: x is read twice and the chunk states go through memory):
    chunk_cumsum:   read dt (+ A, dt_bias), write dt_out and dA_cumsum (b h nchunks Q each)
    fwd_pass_state: read x, B, dt_out, dA_cumsum, write chunk_states (b nchunks h p n) and
                    final_states (b h p n)
    compute_out:    read x, B, C, dt_out, dA_cumsum, chunk_states (+ D, z), write y
    ssd_scan:       read x, B, C, dt_out, dA_cumsum (+ D, z), write y and final_states; its
                    FLOP are the forward's (the state passing in the carry of each block)

Floor: max(FLOP / peak, bytes / bandwidth) with the H200 ceilings measured in the spec:
361 TFLOP/s TF32 (fp32 inputs), 684 TFLOP/s bf16/fp16, 4.2 TB/s device-to-device copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract import Dims

PEAK_FLOPS = {"float32": 361e12, "bfloat16": 684e12, "float16": 684e12}
BANDWIDTH = 4.2e12  # bytes/s, H200 device-to-device copy
STATE_ITEMSIZE = 4  # dt, A, D, dt_bias, states, dA_cumsum stay fp32
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}

OPS = ("ssd_forward", "chunk_cumsum", "fwd_pass_state", "compute_out", "ssd_scan")


@dataclass(frozen=True)
class Work:
    flop: float
    bytes: float


def _chunk_lengths(dims: Dims) -> list[int]:
    full, last = divmod(dims.seqlen, dims.chunk_size)
    return [dims.chunk_size] * full + ([last] if last else [])


def work(op: str, dims: Dims, dtype: str = "float32", *, D: str | None = "nheads_headdim",
         z: bool = False, final_states: bool = True) -> Work:
    """FLOP and compulsory bytes of `op` on `dims` with inputs of `dtype` (see the module doc).

    D is None, "nheads" or "nheads_headdim" (its shape); z says whether the gate is on;
    final_states whether ssd_forward returns them.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if dtype not in ITEMSIZE:
        raise ValueError(f"dtype must be one of {tuple(ITEMSIZE)}, got {dtype!r}")
    b, t, h, p, n, g = dims.batch, dims.seqlen, dims.nheads, dims.headdim, dims.dstate, dims.ngroups
    w, s = ITEMSIZE[dtype], STATE_ITEMSIZE
    sum_q2 = sum(q * q for q in _chunk_lengths(dims))
    padded = dims.nchunks * dims.chunk_size

    x_bytes = b * t * h * p * w
    bc_bytes = b * t * g * n * w  # one of B, C
    dt_bytes = b * t * h * s
    d_bytes = {None: 0, "nheads": h * s, "nheads_headdim": h * p * s}[D]
    z_bytes = x_bytes if z else 0
    state_bytes = b * h * p * n * s
    chunk_vec_bytes = b * h * padded * s  # dt_out or dA_cumsum

    cb = 2 * b * g * n * sum_q2
    intra = b * h * p * sum_q2
    chunk_states = 2 * b * h * p * n * t
    carried = 2 * b * h * p * n * t
    passing = 2 * b * h * p * n * dims.nchunks

    if op == "ssd_forward":
        return Work(cb + intra + chunk_states + carried + passing,
                    x_bytes + dt_bytes + h * s + 2 * bc_bytes + d_bytes + z_bytes + x_bytes
                    + (state_bytes if final_states else 0))
    if op == "chunk_cumsum":
        return Work(0.0, dt_bytes + 2 * h * s + 2 * chunk_vec_bytes)
    if op == "ssd_scan":
        return Work(cb + intra + chunk_states + carried + passing,
                    x_bytes + 2 * bc_bytes + 2 * chunk_vec_bytes + d_bytes + z_bytes + x_bytes
                    + state_bytes)
    if op == "fwd_pass_state":
        return Work(chunk_states + passing,
                    x_bytes + bc_bytes + 2 * chunk_vec_bytes
                    + dims.nchunks * state_bytes + state_bytes)
    return Work(cb + intra + carried,
                x_bytes + 2 * bc_bytes + 2 * chunk_vec_bytes + dims.nchunks * state_bytes
                + d_bytes + z_bytes + x_bytes)


def floor_seconds(wk: Work, dtype: str = "float32") -> float:
    """The roofline floor: the slower of compute at peak and traffic at full bandwidth."""
    return max(wk.flop / PEAK_FLOPS[dtype], wk.bytes / BANDWIDTH)


def rates(wk: Work, seconds: float, dtype: str = "float32") -> dict[str, float]:
    """What a measured time means against the model: the numbers recorded in extra_info.

    pct_of_floor is floor / measured * 100: 100 % means running at the roofline floor.
    """
    floor = floor_seconds(wk, dtype)
    return {
        "gflop": wk.flop / 1e9,
        "gbytes": wk.bytes / 1e9,
        "tflops": wk.flop / seconds / 1e12,
        "gbps": wk.bytes / seconds / 1e9,
        "floor_ms": floor * 1e3,
        "pct_of_floor": 100.0 * floor / seconds,
    }
