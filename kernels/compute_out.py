"""compute_out: every chunk's output from the state entering it, fused in one kernel."""

from __future__ import annotations

import cuda.tile as ct

from contract import ACTIVATION_DTYPES, check_compute_out_args
from kernels.arrays import MMA_MIN, backend_of, check_grid, pow2_tile
from kernels.chunk_cumsum import LOG2E  # the z gate's sigmoid is taken with exp2 too

# Tile sizes (launcher-chosen constants, so performance work can tune them here): a program
# computes [BLOCK_T, BLOCK_P] of y, looping over the chunk's s-blocks of BLOCK_T tokens up to the
# diagonal (flash-attention-like), so a chunk x chunk matrix never exists, not even in registers.
# dstate is held whole (padded to a power of two); BLOCK_T shrinks as dstate grows so that the
# C and B tiles, [BLOCK_T, DSTATE], stay at 8K elements.
MAX_BLOCK_T = 64
MAX_BLOCK_P = 64
TILE_ELEMENTS = 8192
# Two programs per SM: the H200 sweep (benchmarks/NOTES.md) measured 1.69 -> 1.39 ms on the
# Mamba-2 2.7B row, 1.55 -> 1.00 at chunk 64, 1.13 -> 0.63 with 8 groups (the compiler's
# automatic choice left the loads' latency exposed).
OCCUPANCY = 2
# With dstate <= SMALL_DSTATE the programs are small enough for four per SM: 0.63 -> 0.55 ms on
# the 8-group row (dstate 64); with dstate 128 four were slower (0.99 -> 1.30 at chunk 64).
SMALL_DSTATE = 64
SMALL_DSTATE_OCCUPANCY = 4


@ct.kernel(occupancy=OCCUPANCY)
def _compute_out_kernel(x: ct.IndexedWithInt64, B: ct.IndexedWithInt64, C: ct.IndexedWithInt64,
                        dt_out: ct.IndexedWithInt64, dA_cumsum: ct.IndexedWithInt64,
                        chunk_states: ct.IndexedWithInt64, D, z: ct.IndexedWithInt64,
                        seg: ct.IndexedWithInt64, y: ct.IndexedWithInt64,
                        CHUNK: ct.Constant[int], BLOCK_T: ct.Constant[int],
                        BLOCK_P: ct.Constant[int], DSTATE: ct.Constant[int],
                        HAS_D: ct.Constant[bool], D_PER_HEADDIM: ct.Constant[bool],
                        HAS_Z: ct.Constant[bool], HAS_SEQ_IDX: ct.Constant[bool]):
    """One program: y for BLOCK_T tokens x BLOCK_P headdim columns of one (batch, head);
    grid (token blocks x headdim blocks, nheads, batch)."""
    tp = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    p_blocks = ct.cdiv(x.shape[3], BLOCK_P)
    tb = tp // p_blocks  # token block, in units of BLOCK_T tokens
    pb = tp % p_blocks
    T_PER_CHUNK = CHUNK // BLOCK_T
    c = tb // T_PER_CHUNK
    i = tb % T_PER_CHUNK  # the token block's position in its chunk
    g = h // (x.shape[2] // B.shape[2])  # the group head h reads

    a_t = ct.reshape(ct.load(dA_cumsum, (b, h, c, i), shape=(1, 1, 1, BLOCK_T)), (BLOCK_T, 1))
    # x, B, C, z are float32, bfloat16 or float16 arrays: each load is widened to float32 at
    # once (exact), so the arithmetic below is the same for every input dtype
    Ct = ct.load(C, (b, tb, g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                 padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    Ct = ct.reshape(Ct, (BLOCK_T, DSTATE)).astype(ct.tfloat32)

    # carried-state term: 2^(a_t) * C_t . S_c^T
    S = ct.load(chunk_states, (b, c, h, pb, 0), shape=(1, 1, 1, BLOCK_P, DSTATE),
                padding_mode=ct.PaddingMode.ZERO)
    S = ct.transpose(ct.reshape(S, (BLOCK_P, DSTATE))).astype(ct.tfloat32)  # [DSTATE, BLOCK_P]
    acc = ct.mma(Ct, S, ct.zeros((BLOCK_T, BLOCK_P), dtype=ct.float32))
    decay_in = ct.exp2(ct.minimum(a_t, 0.0))  # [BLOCK_T, 1]; clamp: rounding must not make it > 1
    if HAS_SEQ_IDX:
        seg_t = ct.load(seg, (b, tb), shape=(1, BLOCK_T), padding_mode=ct.PaddingMode.ZERO)
        seg_t = ct.reshape(seg_t, (BLOCK_T, 1))
        # the carried state belongs to the segment of the token before the chunk (chunk 0: 0)
        seg_before = ct.load(seg, (b, ct.maximum(c * CHUNK - 1, 0)), shape=(1, 1))
        decay_in = ct.where(seg_t == seg_before, decay_in, 0.0)
    acc = acc * decay_in  # [BLOCK_T, BLOCK_P]

    # intra-chunk term: sum over s-blocks j <= i of (C_t . B_s^T o L) (dt_s x_s)
    rows = ct.reshape(i * BLOCK_T + ct.arange(BLOCK_T, dtype=ct.int32), (BLOCK_T, 1))
    for j in range(i + 1):
        sb = c * T_PER_CHUNK + j
        Bs = ct.load(B, (b, sb, g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                     padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        # [DSTATE, BLOCK_T]
        Bs = ct.transpose(ct.reshape(Bs, (BLOCK_T, DSTATE))).astype(ct.tfloat32)
        cb = ct.mma(Ct, Bs, ct.zeros((BLOCK_T, BLOCK_T), dtype=ct.float32))  # [t, s]
        a_s = ct.reshape(ct.load(dA_cumsum, (b, h, c, j), shape=(1, 1, 1, BLOCK_T)), (1, BLOCK_T))
        dt_s = ct.reshape(ct.load(dt_out, (b, h, c, j), shape=(1, 1, 1, BLOCK_T)), (1, BLOCK_T))
        cols = ct.reshape(j * BLOCK_T + ct.arange(BLOCK_T, dtype=ct.int32), (1, BLOCK_T))
        keep = rows >= cols  # causal: s <= t
        if HAS_SEQ_IDX:
            seg_s = ct.load(seg, (b, sb), shape=(1, BLOCK_T), padding_mode=ct.PaddingMode.ZERO)
            keep = keep & (seg_t == seg_s)
        # L[t, s] = 2^(a_t - a_s): a select on a clamped exponent, so 2^(positive) is never
        # formed above the diagonal and no inf * 0 can appear
        L = ct.where(keep, ct.exp2(ct.minimum(a_t - a_s, 0.0)), 0.0)  # [BLOCK_T, BLOCK_T]
        xs = ct.load(x, (b, sb, h, pb), shape=(1, BLOCK_T, 1, BLOCK_P),
                     padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        xs = ct.reshape(xs, (BLOCK_T, BLOCK_P)).astype(ct.tfloat32)
        acc = ct.mma((cb * L * dt_s).astype(ct.tfloat32), xs, acc)

    if HAS_D:
        xt = ct.load(x, (b, tb, h, pb), shape=(1, BLOCK_T, 1, BLOCK_P),
                     padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        if D_PER_HEADDIM:
            d = ct.load(D, (h, pb), shape=(1, BLOCK_P), padding_mode=ct.PaddingMode.ZERO)
        else:
            d = ct.load(D, (h,), shape=(1,))
            d = ct.reshape(d, (1, 1))
        acc = acc + d * ct.reshape(xt, (BLOCK_T, BLOCK_P))
    if HAS_Z:
        zt = ct.load(z, (b, tb, h, pb), shape=(1, BLOCK_T, 1, BLOCK_P),
                     padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        zt = ct.reshape(zt, (BLOCK_T, BLOCK_P))
        # z * sigmoid(z) = z / (1 + 2^(-z log2 e)); for very negative z the denominator is inf
        # and the gate is -0, its limit
        acc = acc * (zt / (1.0 + ct.exp2(-zt * LOG2E)))
    # rows past seqlen and columns past headdim are masked by the store; y has x's dtype (one
    # rounding of the float32 result for narrow inputs)
    ct.store(y, (b, tb, h, pb), ct.reshape(acc, (1, BLOCK_T, 1, BLOCK_P)).astype(y.dtype))


_compute_out_kernel_small_dstate = _compute_out_kernel.replace_hints(
    occupancy=SMALL_DSTATE_OCCUPANCY)


def compute_out_launch(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y):
    """(kernel, grid, kernel args) of _compute_out_kernel: the one place its tiles and hints are
    chosen.

    Reads only shapes, so the compile gate derives its signatures from here too. `seg` is the
    (batch, seqlen) int32 segment ids, or None.
    """
    batch, seqlen, nheads, headdim = (int(s) for s in x.shape)
    dstate = int(B.shape[3])
    chunk_size = int(dt_out.shape[3])
    dstate_tile = pow2_tile(dstate, lo=MMA_MIN)
    block_t = max(MMA_MIN, min(chunk_size, MAX_BLOCK_T, TILE_ELEMENTS // dstate_tile))
    block_p = pow2_tile(headdim, lo=MMA_MIN, hi=MAX_BLOCK_P)
    grid = (-(-seqlen // block_t) * -(-headdim // block_p), nheads, batch)
    args = (x, B, C, dt_out, dA_cumsum, chunk_states,
            x if D is None else D, x if z is None else z, dt_out if seg is None else seg, y,
            chunk_size, block_t, block_p, dstate_tile,
            D is not None, D is not None and len(D.shape) == 2, z is not None, seg is not None)
    kernel = (_compute_out_kernel_small_dstate if dstate_tile <= SMALL_DSTATE
              else _compute_out_kernel)
    return kernel, grid, args


def compute_out(x, B, C, dt_out, dA_cumsum, chunk_states, D=None, z=None, seq_idx=None, *,
                check_values=True):
    """y, (batch, seqlen, nheads, headdim) in x's dtype, of the caller's array type:
    carried-state term + (C B^T o L)(dt x) + D x, then the z gate. x, B, C, z: float32, bfloat16
    or float16, all alike; the rest float32. `check_values=False`: as in ssd_forward."""
    backend = backend_of(x=x, B=B, C=C, dt_out=dt_out, dA_cumsum=dA_cumsum,
                         chunk_states=chunk_states, D=D, z=z, seq_idx=seq_idx)
    dims = check_compute_out_args(x, B, C, dt_out, dA_cumsum, chunk_states, D=D, z=z,
                                  seq_idx=seq_idx, float_dtypes=("float32",),
                                  activation_dtypes=ACTIVATION_DTYPES, check_values=check_values)
    check_grid(dims.batch, dims.nheads)
    x, B, C = (backend.contiguous(a) for a in (x, B, C))
    dt_out, dA_cumsum, chunk_states = (
        backend.contiguous_float32(a) for a in (dt_out, dA_cumsum, chunk_states))
    D, z = backend.contiguous_float32(D), backend.contiguous(z)
    seg = backend.segment_ids(seq_idx)
    y = backend.empty(dims.shape("y"), like=x)
    backend.launch(*compute_out_launch(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y))
    return y
