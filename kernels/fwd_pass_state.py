"""fwd_pass_state: the state entering every chunk, by the jump formula (a matrix product per chunk,
in blocks of up to 128 tokens): one program through the chunks in order, or, when that leaves
SMs idle, every chunk's own product in parallel and then a short elementwise pass."""

from __future__ import annotations

import cuda.tile as ct

from contract import ACTIVATION_DTYPES, check_fwd_pass_state_args
from kernels.arrays import (MMA_MIN, backend_of, check_grid, int32_indexed, needs_int64,
                           pow2_tile)

# Tile sizes (launcher-chosen constants, so performance work can tune them here):
# the state slice of one program is [BLOCK_P, BLOCK_N]; the chunk's tokens are consumed
# BLOCK_K at a time, one mma per BLOCK_K tokens.
# BLOCK_N up to 128 holds Mamba-2's whole dstate, so x is read once: on the H200 fewer, larger
# programs won (run 2, 64-bit kernel: 0.51 -> 0.46 ms on the 2.7B row, 0.96 -> 0.78 at chunk 64;
# on the transposed kernel, run 8, BLOCK_N 64 at occupancy 2: 0.417 against 0.347 on the 2.7B
# row, 0.585 against 0.523 at chunk 64; benchmarks/NOTES.md).
MAX_BLOCK_P = 64
MAX_BLOCK_N = 128
# A chunk of up to WHOLE_CHUNK_K tokens is one product, a longer one goes WHOLE_CHUNK_K tokens at a
# time; products of WHOLE_CHUNK_K tokens run two programs per SM. H200, benchmarks/NOTES.md runs
# 8-11: chunk 128 (8-group row) as one product at two per SM 0.160 ms, against 0.186 as two
# products; chunk 256 in products of 128 at two per SM 0.309 ms on the 2.7B row (320 programs),
# against 0.348 in products of 64 at the compiler's occupancy; chunk 64 at the compiler's
# occupancy 0.523 ms, at two per SM 0.588.
WHOLE_CHUNK_K = 128
TWO_PER_SM = 2
# Chunks in parallel: when the sequential grid (headdim blocks x dstate blocks, nheads, batch) has
# fewer programs than the device has SMs, SMs would idle through the whole pass. Then, for chunks
# of WHOLE_CHUNK_K tokens or more, every chunk's increment (what its tokens add to a state that
# entered at zero) is one program (its products as above), written where the chunk's entering
# state goes, and a pass through the chunks on [PASS_BLOCK_P, PASS_BLOCK_N] slices replaces each
# increment by the state entering its chunk. H200 (benchmarks/NOTES.md, runs 18-19): long_seq
# (80 programs on 132 SMs) 0.458 -> 0.333 ms (increments 0.227 of it, in products of 128 tokens
# at two per SM; of 64 at two per SM 0.256, at the compiler's occupancy 0.363); batch 1 at 4096
# tokens 0.137 -> 0.088 (80 heads), 0.132 -> 0.041 (24 heads); chunk 128, 8 groups, batch 1 at
# 16384 tokens 0.459 -> 0.324. The pass takes one dependent step per chunk: at chunk 64 (256
# chunks at 16384 tokens) the two launches ran 0.868-1.081 ms against 0.702 in order, so shorter
# chunks stay in order. With more programs than SMs the order wins (2.7B row, 320 programs:
# 0.308 against 0.323).
PASS_BLOCK_P = 32
PASS_BLOCK_N = 32
# An SM count that selects each mode whatever the grid (kernels.arrays.sm_count_as): tests and
# properties run every mode of a chunk size (`modes`) on any device.
MODE_SM_COUNTS = {"in_order": 1, "parallel_chunks": 2**31}


def modes(chunk_size: int) -> tuple[str, ...]:
    """The modes the launcher may choose at this chunk size: in order always, chunks in parallel
    from WHOLE_CHUNK_K tokens."""
    return ("in_order", "parallel_chunks") if chunk_size >= WHOLE_CHUNK_K else ("in_order",)


def _fwd_pass_state_kernel(x: ct.IndexedWithInt64, B: ct.IndexedWithInt64,
                           dt_out: ct.IndexedWithInt64, dA_cumsum: ct.IndexedWithInt64,
                           initial_states: ct.IndexedWithInt64, seg: ct.IndexedWithInt64,
                           chunk_states: ct.IndexedWithInt64, final_states: ct.IndexedWithInt64,
                           CHUNK: ct.Constant[int], BLOCK_K: ct.Constant[int],
                           BLOCK_P: ct.Constant[int], BLOCK_N: ct.Constant[int],
                           PARALLEL_CHUNKS: ct.Constant[bool],
                           HAS_INITIAL_STATES: ct.Constant[bool], HAS_SEQ_IDX: ct.Constant[bool]):
    """One program: a (batch, head)'s state slice [BLOCK_P, BLOCK_N] through its chunks, grid
    (headdim x dstate blocks, nheads, batch); PARALLEL_CHUNKS: one chunk, grid (chunks x those)."""
    pn = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    seqlen = x.shape[1]
    n_blocks = ct.cdiv(B.shape[3], BLOCK_N)
    pn_blocks = ct.cdiv(x.shape[3], BLOCK_P) * n_blocks
    pb = pn % pn_blocks // n_blocks
    nb = pn % n_blocks
    g = h // (x.shape[2] // B.shape[2])  # the group head h reads
    K_PER_CHUNK = CHUNK // BLOCK_K
    if PARALLEL_CHUNKS:
        c_first = pn // pn_blocks
        c_end = c_first + 1
    else:
        c_first = 0
        c_end = dt_out.shape[2]

    # The program carries the transposed slice S^T, [BLOCK_N, BLOCK_P], so that the product
    # takes B (transposed) first and the computed (w o X) second: on the H200 this order ran
    # 0.465 -> 0.347 ms on the Mamba-2 2.7B row (benchmarks/NOTES.md, run 7).
    if HAS_INITIAL_STATES and not PARALLEL_CHUNKS:
        S = ct.load(initial_states, (b, h, pb, nb), shape=(1, 1, BLOCK_P, BLOCK_N),
                    padding_mode=ct.PaddingMode.ZERO)
        S = ct.transpose(ct.reshape(S, (BLOCK_P, BLOCK_N)))
    else:
        S = ct.zeros((BLOCK_N, BLOCK_P), dtype=ct.float32)
    seg_before = ct.zeros((1, 1), dtype=ct.int32)  # the initial state's segment: 0
    for c in range(c_first, c_end):
        if not PARALLEL_CHUNKS:
            ct.store(chunk_states, (b, c, h, pb, nb),
                     ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)))
        # a_last: the decay over the whole chunk (flat over a short chunk's padding)
        a_last = ct.reshape(ct.load(dA_cumsum, (b, h, c, CHUNK - 1), shape=(1, 1, 1, 1)), (1, 1))
        carry = ct.exp2(ct.minimum(a_last, 0.0))  # clamp: rounding must not make it > 1
        if HAS_SEQ_IDX:
            # the state handed on belongs to the segment of the chunk's last real token
            last = ct.minimum(c * CHUNK + (CHUNK - 1), seqlen - 1)
            seg_last = ct.load(seg, (b, last), shape=(1, 1))
            carry = ct.where(seg_last == seg_before, carry, 0.0)
            seg_before = seg_last
        acc = S * carry  # [BLOCK_N, BLOCK_P]; zero with PARALLEL_CHUNKS (the increment alone)
        # token blocks that hold real tokens (a block wholly past seqlen must not be loaded)
        k_blocks = ct.minimum(K_PER_CHUNK, ct.cdiv(seqlen - c * CHUNK, BLOCK_K))
        for k in range(k_blocks):
            tb = c * K_PER_CHUNK + k
            # x and B may be bfloat16 or float16 arrays: widened to float32 at once (exact)
            xk = ct.load(x, (b, tb, h, pb), shape=(1, BLOCK_K, 1, BLOCK_P),
                         padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
            xk = ct.reshape(xk, (BLOCK_K, BLOCK_P))
            Bk = ct.load(B, (b, tb, g, nb), shape=(1, BLOCK_K, 1, BLOCK_N),
                         padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
            Bk = ct.reshape(Bk, (BLOCK_K, BLOCK_N))
            ak = ct.load(dA_cumsum, (b, h, c, k), shape=(1, 1, 1, BLOCK_K))
            ak = ct.reshape(ak, (BLOCK_K, 1))
            dtk = ct.reshape(ct.load(dt_out, (b, h, c, k), shape=(1, 1, 1, BLOCK_K)), (BLOCK_K, 1))
            # w_s = dt_s * 2^(a_last - a_s); the exponent is <= 0 up to rounding: clamped
            w = dtk * ct.exp2(ct.minimum(a_last - ak, 0.0))  # [BLOCK_K, 1], scales x's rows
            if HAS_SEQ_IDX:
                sk = ct.load(seg, (b, tb), shape=(1, BLOCK_K), padding_mode=ct.PaddingMode.ZERO)
                w = ct.where(ct.reshape(sk, (BLOCK_K, 1)) == seg_last, w, 0.0)
            # [BLOCK_N, BLOCK_K] @ [BLOCK_K, BLOCK_P], TF32 operands, fp32 accumulator
            acc = ct.mma(ct.transpose(Bk).astype(ct.tfloat32), (xk * w).astype(ct.tfloat32), acc)
        S = acc
    if PARALLEL_CHUNKS:  # the chunk's increment, where its entering state goes (_state_pass)
        ct.store(chunk_states, (b, c_first, h, pb, nb),
                 ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)))
    else:
        ct.store(final_states, (b, h, pb, nb),
                 ct.reshape(ct.transpose(S), (1, 1, BLOCK_P, BLOCK_N)))


def _state_pass_kernel(initial_states: ct.IndexedWithInt64, seg: ct.IndexedWithInt64,
                       dA_cumsum: ct.IndexedWithInt64, chunk_states: ct.IndexedWithInt64,
                       final_states: ct.IndexedWithInt64, CHUNK: ct.Constant[int],
                       BLOCK_P: ct.Constant[int], BLOCK_N: ct.Constant[int],
                       HAS_INITIAL_STATES: ct.Constant[bool], HAS_SEQ_IDX: ct.Constant[bool]):
    """One program: [BLOCK_P, BLOCK_N] of a (batch, head)'s chunk increments replaced in order by
    the states entering the chunks; grid (headdim blocks x dstate blocks, nheads, batch)."""
    pn = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    n_blocks = ct.cdiv(chunk_states.shape[4], BLOCK_N)
    pb = pn // n_blocks
    nb = pn % n_blocks
    END = CHUNK - 1  # a chunk's last position
    if HAS_INITIAL_STATES:
        S = ct.load(initial_states, (b, h, pb, nb), shape=(1, 1, BLOCK_P, BLOCK_N),
                    padding_mode=ct.PaddingMode.ZERO)
        S = ct.reshape(S, (BLOCK_P, BLOCK_N))
    else:
        S = ct.zeros((BLOCK_P, BLOCK_N), dtype=ct.float32)
    seg_before = ct.zeros((1, 1), dtype=ct.int32)  # the initial state's segment: 0
    for c in range(dA_cumsum.shape[2]):
        increment = ct.load(chunk_states, (b, c, h, pb, nb), shape=(1, 1, 1, BLOCK_P, BLOCK_N),
                            padding_mode=ct.PaddingMode.ZERO)
        ct.store(chunk_states, (b, c, h, pb, nb), ct.reshape(S, (1, 1, 1, BLOCK_P, BLOCK_N)))
        # as in _fwd_pass_state_kernel: the decay over the whole chunk, and the state handed on
        # belongs to the segment of the chunk's last real token
        a_last = ct.reshape(ct.load(dA_cumsum, (b, h, c, END), shape=(1, 1, 1, 1)), (1, 1))
        carry = ct.exp2(ct.minimum(a_last, 0.0))  # clamp: rounding must not make it > 1
        if HAS_SEQ_IDX:
            last = ct.minimum(c * CHUNK + END, seg.shape[1] - 1)
            seg_last = ct.load(seg, (b, last), shape=(1, 1))
            carry = ct.where(seg_last == seg_before, carry, 0.0)
            seg_before = seg_last
        S = S * carry + ct.reshape(increment, (BLOCK_P, BLOCK_N))
    ct.store(final_states, (b, h, pb, nb), ct.reshape(S, (1, 1, BLOCK_P, BLOCK_N)))


# the kernel objects: int32 or int64 indices (kernels.arrays.needs_int64); the state kernel also
# at two programs per SM (products of WHOLE_CHUNK_K tokens)
_fwd_pass_state = ct.kernel(int32_indexed(_fwd_pass_state_kernel))
_fwd_pass_state_two_per_sm = _fwd_pass_state.replace_hints(occupancy=TWO_PER_SM)
_fwd_pass_state_int64 = ct.kernel(_fwd_pass_state_kernel)
_fwd_pass_state_int64_two_per_sm = _fwd_pass_state_int64.replace_hints(occupancy=TWO_PER_SM)
_state_pass = ct.kernel(int32_indexed(_state_pass_kernel))
_state_pass_int64 = ct.kernel(_state_pass_kernel)


def _state_slices(headdim: int, dstate: int) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_N, slices): a program's state slice and the slices of one head's state."""
    block_p = pow2_tile(headdim, lo=MMA_MIN, hi=MAX_BLOCK_P)
    block_n = pow2_tile(dstate, lo=MMA_MIN, hi=MAX_BLOCK_N)
    return block_p, block_n, -(-headdim // block_p) * -(-dstate // block_n)


def in_order_programs(batch: int, nheads: int, headdim: int, dstate: int) -> int:
    """The programs of the in-order grid: (headdim blocks x dstate blocks, nheads, batch)."""
    return _state_slices(headdim, dstate)[2] * nheads * batch


def fwd_pass_state_launches(x, B, dt_out, dA_cumsum, initial_states, seg, chunk_states,
                            final_states, sm_count):
    """[(kernel, grid, kernel args)] of fwd_pass_state, in launch order: the chunks in order, or
    the chunks in parallel then the pass. The one place its tiles, its mode and its kernel
    objects (index width, occupancy) are chosen.

    Reads only shapes and the device's SM count, so the compile gate derives its signatures from
    here too. `seg` is the (batch, seqlen) int32 segment ids, or None.
    """
    batch, _, nheads, headdim = (int(s) for s in x.shape)
    dstate = int(B.shape[3])
    chunk_size, nchunks = int(dt_out.shape[3]), int(dt_out.shape[2])
    block_p, block_n, pn_blocks = _state_slices(headdim, dstate)
    block_k = min(chunk_size, WHOLE_CHUNK_K)
    parallel = chunk_size >= WHOLE_CHUNK_K and pn_blocks * nheads * batch < sm_count
    initial = x if initial_states is None else initial_states  # a placeholder when absent
    seg_arg = dt_out if seg is None else seg
    args = (x, B, dt_out, dA_cumsum, initial, seg_arg, chunk_states, final_states,
            chunk_size, block_k, block_p, block_n, parallel, initial_states is not None,
            seg is not None)
    int64 = needs_int64(*args)
    two_per_sm = block_k == WHOLE_CHUNK_K
    kernel = {(False, False): _fwd_pass_state, (False, True): _fwd_pass_state_two_per_sm,
              (True, False): _fwd_pass_state_int64,
              (True, True): _fwd_pass_state_int64_two_per_sm}[int64, two_per_sm]
    if not parallel:
        return [(kernel, (pn_blocks, nheads, batch), args)]
    pass_p = pow2_tile(headdim, hi=PASS_BLOCK_P)
    pass_n = pow2_tile(dstate, hi=PASS_BLOCK_N)
    pass_grid = (-(-headdim // pass_p) * -(-dstate // pass_n), nheads, batch)
    pass_args = (initial, seg_arg, dA_cumsum, chunk_states, final_states, chunk_size,
                 pass_p, pass_n, initial_states is not None, seg is not None)
    return [(kernel, (nchunks * pn_blocks, nheads, batch), args),
            (_state_pass_int64 if int64 else _state_pass, pass_grid, pass_args)]


def fwd_pass_state(x, B, dt_out, dA_cumsum, initial_states=None, seq_idx=None):
    """(chunk_states, final_states), float32, of the caller's array type: the state entering
    every chunk, (batch, nchunks, nheads, headdim, dstate), and the state after the last token,
    (batch, nheads, headdim, dstate). x and B: float32, bfloat16 or float16, alike."""
    backend = backend_of(x=x, B=B, dt_out=dt_out, dA_cumsum=dA_cumsum,
                         initial_states=initial_states, seq_idx=seq_idx)
    dims = check_fwd_pass_state_args(x, B, dt_out, dA_cumsum, initial_states=initial_states,
                                     seq_idx=seq_idx, float_dtypes=("float32",),
                                     activation_dtypes=ACTIVATION_DTYPES)
    check_grid(dims.batch, dims.nheads)
    x, B = backend.contiguous(x), backend.contiguous(B)
    dt_out, dA_cumsum = backend.contiguous_float32(dt_out), backend.contiguous_float32(dA_cumsum)
    initial_states = backend.contiguous_float32(initial_states)
    seg = backend.segment_ids(seq_idx)
    chunk_states = backend.empty(dims.shape("chunk_states"))
    final_states = backend.empty(dims.shape("final_states"))
    for launch in fwd_pass_state_launches(x, B, dt_out, dA_cumsum, initial_states, seg,
                                          chunk_states, final_states, backend.sm_count):
        backend.launch(*launch)
    return chunk_states, final_states
