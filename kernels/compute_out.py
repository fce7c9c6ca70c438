"""compute_out: every chunk's output from the state entering it, fused in one kernel."""

from __future__ import annotations

import cuda.tile as ct

from contract import ACTIVATION_DTYPES, check_compute_out_args
from kernels.arrays import MMA_MIN, backend_of, check_grid, heads_per_program, pow2_tile
from kernels.chunk_cumsum import LOG2E  # the z gate's sigmoid is taken with exp2 too

# Tile sizes (launcher-chosen constants, so performance work can tune them here): a program
# computes y for BLOCK_T tokens x BLOCK_H heads of one group x BLOCK_P headdim columns. The
# heads of a program share C, B and C_t B_s^T (computed once, not once per head); the products
# that carry the heads have BLOCK_H * BLOCK_P <= MAX_HEAD_COLUMNS columns. dstate is held whole
# (padded to a power of two); BLOCK_T shrinks as dstate grows so that the C and B tiles,
# [BLOCK_T, DSTATE], stay at TILE_ELEMENTS. No chunk x chunk matrix exists, not even in registers:
# the s-blocks of the chunk are visited in a loop up to the diagonal.
MAX_BLOCK_T = 64
MAX_BLOCK_P = 64
MAX_BLOCK_H = 4
MAX_HEAD_COLUMNS = 256
TILE_ELEMENTS = 8192
OCCUPANCY = 2


@ct.kernel(occupancy=OCCUPANCY)
def _compute_out_kernel(x: ct.IndexedWithInt64, B: ct.IndexedWithInt64, C: ct.IndexedWithInt64,
                        dt_out: ct.IndexedWithInt64, dA_cumsum: ct.IndexedWithInt64,
                        chunk_states: ct.IndexedWithInt64, D, z: ct.IndexedWithInt64,
                        seg: ct.IndexedWithInt64, y: ct.IndexedWithInt64,
                        CHUNK: ct.Constant[int], BLOCK_T: ct.Constant[int],
                        BLOCK_H: ct.Constant[int], BLOCK_P: ct.Constant[int],
                        DSTATE: ct.Constant[int], HAS_D: ct.Constant[bool],
                        D_PER_HEADDIM: ct.Constant[bool], HAS_Z: ct.Constant[bool],
                        HAS_SEQ_IDX: ct.Constant[bool]):
    """One program: y for BLOCK_T tokens x BLOCK_H heads (one group) x BLOCK_P headdim columns;
    grid (token blocks x headdim blocks, head blocks, batch)."""
    tp = ct.bid(0)
    hb = ct.bid(1)  # head block: heads hb * BLOCK_H ... + BLOCK_H - 1, all of one group
    b = ct.bid(2)
    p_blocks = ct.cdiv(x.shape[3], BLOCK_P)
    tb = tp // p_blocks  # token block, in units of BLOCK_T tokens
    pb = tp % p_blocks
    T_PER_CHUNK = CHUNK // BLOCK_T
    HP = BLOCK_H * BLOCK_P
    c = tb // T_PER_CHUNK
    i = tb % T_PER_CHUNK  # the token block's position in its chunk
    g = (hb * BLOCK_H) // (x.shape[2] // B.shape[2])  # the group the block's heads read

    # Decays relative to the block's first token r = i * BLOCK_T: for t >= r > s (the carried
    # state and every earlier s-block), 2^(a_t - a_s) = 2^(a_t - a_r) * 2^(a_r - a_s), two
    # factors <= 1 (dA_cumsum is non-increasing), so they never overflow, and where one
    # underflows the exact term is smaller still. That makes the off-diagonal decay a row factor
    # times a column factor: the column factor goes into x, the row factor onto the sum, and
    # C_t B_s^T is one product shared by the block's heads.
    a_t = ct.reshape(ct.load(dA_cumsum, (b, hb, c, i), shape=(1, BLOCK_H, 1, BLOCK_T)),
                     (BLOCK_H, BLOCK_T))
    a_r = ct.reshape(ct.load(dA_cumsum, (b, hb, c, i * BLOCK_T), shape=(1, BLOCK_H, 1, 1)),
                     (BLOCK_H, 1))
    # clamps: rounding must not push an exponent above 0
    row_decay = ct.exp2(ct.minimum(a_t - a_r, 0.0))  # [BLOCK_H, BLOCK_T]
    row_decay = ct.reshape(ct.transpose(row_decay), (BLOCK_T, BLOCK_H, 1))

    # x, B, C, z are float32, bfloat16 or float16 arrays: each load is widened to float32 at
    # once (exact), so the arithmetic below is the same for every input dtype
    Ct = ct.load(C, (b, tb, g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                 padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    Ct = ct.reshape(Ct, (BLOCK_T, DSTATE)).astype(ct.tfloat32)
    if HAS_SEQ_IDX:
        seg_t = ct.load(seg, (b, tb), shape=(1, BLOCK_T), padding_mode=ct.PaddingMode.ZERO)
        seg_row = ct.reshape(seg_t, (BLOCK_T, 1))
        # the carried state belongs to the segment of the token before the chunk (chunk 0: 0);
        # rows of another segment take none of it
        seg_before = ct.load(seg, (b, ct.maximum(c * CHUNK - 1, 0)), shape=(1, 1))
        Cs = ct.where(seg_row == seg_before, Ct, 0.0)
    else:
        Cs = Ct

    # carried-state term, up to the row factor: C_t . (2^(a_r) S_c)^T for every head at once
    S = ct.load(chunk_states, (b, c, hb, pb, 0), shape=(1, 1, BLOCK_H, BLOCK_P, DSTATE),
                padding_mode=ct.PaddingMode.ZERO)
    S = ct.reshape(S, (BLOCK_H, BLOCK_P, DSTATE)) * ct.reshape(
        ct.exp2(ct.minimum(a_r, 0.0)), (BLOCK_H, 1, 1))
    S = ct.reshape(ct.permute(S, (2, 0, 1)), (DSTATE, HP)).astype(ct.tfloat32)
    acc = ct.mma(Cs, S, ct.zeros((BLOCK_T, HP), dtype=ct.float32))  # [BLOCK_T, HP]

    # earlier s-blocks j < i: (C_t B_s^T) (2^(a_r - a_s) dt_s x_s), up to the row factor
    for j in range(i):
        sb = c * T_PER_CHUNK + j
        Bs = ct.load(B, (b, sb, g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                     padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        Bs = ct.transpose(ct.reshape(Bs, (BLOCK_T, DSTATE))).astype(ct.tfloat32)
        cb = ct.mma(Ct, Bs, ct.zeros((BLOCK_T, BLOCK_T), dtype=ct.float32))  # [t, s]
        if HAS_SEQ_IDX:
            seg_s = ct.load(seg, (b, sb), shape=(1, BLOCK_T), padding_mode=ct.PaddingMode.ZERO)
            cb = ct.where(seg_row == seg_s, cb, 0.0)
        a_s = ct.reshape(ct.load(dA_cumsum, (b, hb, c, j), shape=(1, BLOCK_H, 1, BLOCK_T)),
                         (BLOCK_H, BLOCK_T))
        dt_s = ct.reshape(ct.load(dt_out, (b, hb, c, j), shape=(1, BLOCK_H, 1, BLOCK_T)),
                          (BLOCK_H, BLOCK_T))
        w = dt_s * ct.exp2(ct.minimum(a_r - a_s, 0.0))  # [BLOCK_H, BLOCK_T]
        w = ct.reshape(ct.transpose(w), (BLOCK_T, BLOCK_H, 1))
        xs = ct.load(x, (b, sb, hb, pb), shape=(1, BLOCK_T, BLOCK_H, BLOCK_P),
                     padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        xs = ct.reshape(ct.reshape(xs, (BLOCK_T, BLOCK_H, BLOCK_P)) * w, (BLOCK_T, HP))
        acc = ct.mma(cb.astype(ct.tfloat32), xs.astype(ct.tfloat32), acc)
    acc = ct.reshape(acc, (BLOCK_T, BLOCK_H, BLOCK_P)) * row_decay

    # the diagonal s-block: a decay per (head, t, s), L = 2^(a_t - a_s) for s <= t, else 0
    Bi = ct.load(B, (b, tb, g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                 padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    Bi = ct.transpose(ct.reshape(Bi, (BLOCK_T, DSTATE))).astype(ct.tfloat32)
    cb = ct.mma(Ct, Bi, ct.zeros((BLOCK_T, BLOCK_T), dtype=ct.float32))  # [t, s]
    rows = ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (BLOCK_T, 1))
    cols = ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (1, BLOCK_T))
    keep = rows >= cols  # causal: s <= t
    if HAS_SEQ_IDX:
        keep = keep & (seg_row == ct.reshape(seg_t, (1, BLOCK_T)))
    a_col = ct.reshape(a_t, (BLOCK_H, 1, BLOCK_T))
    a_row = ct.reshape(a_t, (BLOCK_H, BLOCK_T, 1))
    # a select on a clamped exponent: 2^(positive) is never formed above the diagonal and no
    # inf * 0 can appear
    L = ct.where(ct.reshape(keep, (1, BLOCK_T, BLOCK_T)),
                 ct.exp2(ct.minimum(a_row - a_col, 0.0)), 0.0)  # [BLOCK_H, BLOCK_T, BLOCK_T]
    dt_i = ct.reshape(ct.load(dt_out, (b, hb, c, i), shape=(1, BLOCK_H, 1, BLOCK_T)),
                      (BLOCK_H, 1, BLOCK_T))
    weights = ct.reshape(cb, (1, BLOCK_T, BLOCK_T)) * L * dt_i
    xt = ct.load(x, (b, tb, hb, pb), shape=(1, BLOCK_T, BLOCK_H, BLOCK_P),
                 padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    xt = ct.reshape(xt, (BLOCK_T, BLOCK_H, BLOCK_P))
    xt_heads = ct.permute(xt, (1, 0, 2)).astype(ct.tfloat32)  # [BLOCK_H, BLOCK_T, BLOCK_P]
    diag = ct.mma(weights.astype(ct.tfloat32), xt_heads,
                  ct.zeros((BLOCK_H, BLOCK_T, BLOCK_P), dtype=ct.float32))
    acc = acc + ct.permute(diag, (1, 0, 2))  # [BLOCK_T, BLOCK_H, BLOCK_P]

    if HAS_D:
        if D_PER_HEADDIM:
            d = ct.load(D, (hb, pb), shape=(BLOCK_H, BLOCK_P), padding_mode=ct.PaddingMode.ZERO)
            d = ct.reshape(d, (1, BLOCK_H, BLOCK_P))
        else:
            d = ct.reshape(ct.load(D, (hb,), shape=(BLOCK_H,)), (1, BLOCK_H, 1))
        acc = acc + d * xt
    if HAS_Z:
        zt = ct.load(z, (b, tb, hb, pb), shape=(1, BLOCK_T, BLOCK_H, BLOCK_P),
                     padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        zt = ct.reshape(zt, (BLOCK_T, BLOCK_H, BLOCK_P))
        # z * sigmoid(z) = z / (1 + 2^(-z log2 e)); for very negative z the denominator is inf
        # and the gate is -0, its limit
        acc = acc * (zt / (1.0 + ct.exp2(-zt * LOG2E)))
    # rows past seqlen and columns past headdim are masked by the store; y has x's dtype (one
    # rounding of the float32 result for narrow inputs)
    ct.store(y, (b, tb, hb, pb),
             ct.reshape(acc, (1, BLOCK_T, BLOCK_H, BLOCK_P)).astype(y.dtype))


def compute_out_launch(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y):
    """(grid, kernel args) of _compute_out_kernel: the one place its tiles are chosen.

    Reads only shapes, so the compile gate derives its signatures from here too. `seg` is the
    (batch, seqlen) int32 segment ids, or None.
    """
    batch, seqlen, nheads, headdim = (int(s) for s in x.shape)
    ngroups, dstate = int(B.shape[2]), int(B.shape[3])
    chunk_size = int(dt_out.shape[3])
    dstate_tile = pow2_tile(dstate, lo=MMA_MIN)
    block_t = max(MMA_MIN, min(chunk_size, MAX_BLOCK_T, TILE_ELEMENTS // dstate_tile))
    block_p = pow2_tile(headdim, lo=MMA_MIN, hi=MAX_BLOCK_P)
    block_h = heads_per_program(nheads, ngroups, MAX_BLOCK_H, MAX_HEAD_COLUMNS // block_p)
    grid = (-(-seqlen // block_t) * -(-headdim // block_p), nheads // block_h, batch)
    args = (x, B, C, dt_out, dA_cumsum, chunk_states,
            x if D is None else D, x if z is None else z, dt_out if seg is None else seg, y,
            chunk_size, block_t, block_h, block_p, dstate_tile,
            D is not None, D is not None and len(D.shape) == 2, z is not None, seg is not None)
    return grid, args


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
    grid, args = compute_out_launch(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y)
    backend.launch(grid, _compute_out_kernel, args)
    return y
