"""fwd_pass_state: the state entering every chunk, by the jump formula (a matrix product per chunk,
in blocks of up to 128 tokens): one program through the chunks in order, or, when that leaves
SMs idle, every chunk's own product in parallel and then a short elementwise pass.

The declared choices (CHOICES) are what the launcher may run: its rules pick one per shape and
device (rules_choice), benchmarks.sweep times them, tests and properties run each mode. The
measured reason of each rule: benchmarks/DECISIONS.md, under the titles named below.
"""

from __future__ import annotations

from typing import NamedTuple

import cuda.tile as ct

from contract import ACTIVATION_DTYPES, check_fwd_pass_state_args, state_dtype_name, weight_dtypes
from kernels.arrays import LaunchDims, int32_indexed, launch_dims, needs_int64, pow2_tile
from kernels.launcher import run_alone
from kernels.tiles import MMA_MIN, mma_operand, mma_product

# Modes. "in_order": a program per state slice runs through the chunks in order. "parallel_chunks":
# every chunk's increment (what its tokens add to a state that entered at zero) is one program,
# written where the chunk's entering state goes, then a pass through the chunks on
# [pass_block, pass_block] slices replaces each increment by the state entering its chunk.
MODES = ("in_order", "parallel_chunks")
BLOCK_KS = (128, 64)  # tokens per product (a chunk of fewer is one product)
BLOCK_PS = (64, 32, 16)  # a program's state slice is [block_p, block_n] ...
BLOCK_NS = (128, 64, 32)  # ... of [headdim, dstate]
OCCUPANCIES = (None, 1, 2)  # programs per SM (None: the compiler's choice)
PASS_BLOCKS = (32, 64, 16)  # the pass's slice: [pass_block, pass_block]


class Choice(NamedTuple):
    """One launch configuration of fwd_pass_state beyond its shapes."""
    mode: str  # MODES
    block_k: int  # BLOCK_KS
    block_p: int  # BLOCK_PS
    block_n: int  # BLOCK_NS
    occupancy: int | None  # OCCUPANCIES
    pass_block: int  # PASS_BLOCKS (read in mode parallel_chunks only)


# the declared search space: every choice the launcher can take
CHOICES = tuple(Choice(mode, k, p, n, occupancy, pass_block) for mode in MODES for k in BLOCK_KS
                for p in BLOCK_PS for n in BLOCK_NS for occupancy in OCCUPANCIES
                for pass_block in PASS_BLOCKS)

# The rules' pick (rules_choice):
# a slice of up to 64 x 128 holds Mamba-2's whole head state, so x is read once; DECISIONS.md
# "fwd_pass_state: state slice"
RULES_BLOCK_P = 64
RULES_BLOCK_N = 128
# products of 128 tokens, those at two programs per SM, shorter ones at the compiler's
# occupancy; "fwd_pass_state: tokens per product and occupancy"
RULES_BLOCK_K = 128
RULES_OCCUPANCY_FULL_K = 2
# chunks in parallel where the in-order grid has fewer programs than the device has SMs and the
# chunks hold PARALLEL_MIN_CHUNK tokens or more (the pass takes one dependent step per chunk);
# "fwd_pass_state: chunks in parallel"
PARALLEL_MIN_CHUNK = 128
RULES_PASS_BLOCK = 32


def modes(chunk_size: int) -> tuple[str, ...]:
    """The modes the rules may pick at this chunk size: in order always, chunks in parallel
    from PARALLEL_MIN_CHUNK tokens (a given choice may take either at any chunk size)."""
    return MODES if chunk_size >= PARALLEL_MIN_CHUNK else MODES[:1]


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
    i_pn = ct.bid(0)
    i_h = ct.bid(1)
    i_b = ct.bid(2)
    seqlen = x.shape[1]
    n_blocks = ct.cdiv(B.shape[3], BLOCK_N)
    pn_blocks = ct.cdiv(x.shape[3], BLOCK_P) * n_blocks
    i_p = i_pn % pn_blocks // n_blocks
    i_n = i_pn % n_blocks
    i_g = i_h // (x.shape[2] // B.shape[2])  # the group head i_h reads
    K_PER_CHUNK = CHUNK // BLOCK_K
    if PARALLEL_CHUNKS:
        i_c_first = i_pn // pn_blocks
        i_c_end = i_c_first + 1
    else:
        i_c_first = 0
        i_c_end = dt_out.shape[2]

    # The program carries the transposed slice S^T, [BLOCK_N, BLOCK_P], so that the product
    # takes B (transposed) first and the computed (w o X) second (DECISIONS.md "fwd_pass_state:
    # transposed state").
    if HAS_INITIAL_STATES and not PARALLEL_CHUNKS:
        S = ct.load(initial_states, (i_b, i_h, i_p, i_n), shape=(1, 1, BLOCK_P, BLOCK_N),
                    padding_mode=ct.PaddingMode.ZERO)
        S = ct.transpose(ct.reshape(S, (BLOCK_P, BLOCK_N)).astype(ct.float32))  # 16-bit: widened
    else:
        S = ct.zeros((BLOCK_N, BLOCK_P), dtype=ct.float32)
    seg_before = ct.zeros((1, 1), dtype=ct.int32)  # the initial state's segment: 0
    for i_c in range(i_c_first, i_c_end):
        if not PARALLEL_CHUNKS:  # stored in chunk_states' dtype (float32 or bfloat16)
            ct.store(chunk_states, (i_b, i_c, i_h, i_p, i_n),
                     ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)).astype(
                         chunk_states.dtype))
        # a_last: the decay over the whole chunk (flat over a short chunk's padding)
        a_last = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, CHUNK - 1), shape=(1, 1, 1, 1)),
                            (1, 1))
        carry = ct.exp2(ct.minimum(a_last, 0.0))  # clamp: rounding must not make it > 1
        if HAS_SEQ_IDX:
            # the state handed on belongs to the segment of the chunk's last real token
            last = ct.minimum(i_c * CHUNK + (CHUNK - 1), seqlen - 1)
            seg_last = ct.load(seg, (i_b, last), shape=(1, 1))
            carry = ct.where(seg_last == seg_before, carry, 0.0)
            seg_before = seg_last
        acc = S * carry  # [BLOCK_N, BLOCK_P]; zero with PARALLEL_CHUNKS (the increment alone)
        # token blocks that hold real tokens (a block wholly past seqlen must not be loaded)
        k_blocks = ct.minimum(K_PER_CHUNK, ct.cdiv(seqlen - i_c * CHUNK, BLOCK_K))
        for i_tc in range(k_blocks):
            i_t = i_c * K_PER_CHUNK + i_tc
            # x and B may be bfloat16 or float16 arrays: x widened to float32 at once (exact)
            xk = ct.load(x, (i_b, i_t, i_h, i_p), shape=(1, BLOCK_K, 1, BLOCK_P),
                         padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
            xk = ct.reshape(xk, (BLOCK_K, BLOCK_P))
            Bk = ct.load(B, (i_b, i_t, i_g, i_n), shape=(1, BLOCK_K, 1, BLOCK_N),
                         padding_mode=ct.PaddingMode.ZERO)
            Bk = ct.reshape(Bk, (BLOCK_K, BLOCK_N))
            ak = ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc), shape=(1, 1, 1, BLOCK_K))
            ak = ct.reshape(ak, (BLOCK_K, 1))
            dtk = ct.reshape(ct.load(dt_out, (i_b, i_h, i_c, i_tc), shape=(1, 1, 1, BLOCK_K)),
                             (BLOCK_K, 1))
            # w_s = dt_s * 2^(a_last - a_s); the exponent is <= 0 up to rounding: clamped
            w = dtk * ct.exp2(ct.minimum(a_last - ak, 0.0))  # [BLOCK_K, 1], scales x's rows
            if HAS_SEQ_IDX:
                sk = ct.load(seg, (i_b, i_t), shape=(1, BLOCK_K),
                             padding_mode=ct.PaddingMode.ZERO)
                w = ct.where(ct.reshape(sk, (BLOCK_K, 1)) == seg_last, w, 0.0)
            # [BLOCK_N, BLOCK_K] @ [BLOCK_K, BLOCK_P], fp32 accumulator: TF32 operands, or for
            # 16-bit inputs 16-bit ones, B as it is and w o x rounded (mma_product)
            acc = mma_product(mma_operand(ct.transpose(Bk), B.dtype), xk * w, acc, B.dtype)
        S = acc
    if PARALLEL_CHUNKS:  # the chunk's increment, where its entering state goes (_state_pass)
        ct.store(chunk_states, (i_b, i_c_first, i_h, i_p, i_n),
                 ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)).astype(
                     chunk_states.dtype))
    else:
        ct.store(final_states, (i_b, i_h, i_p, i_n),
                 ct.reshape(ct.transpose(S), (1, 1, BLOCK_P, BLOCK_N)))


def _state_pass_kernel(initial_states: ct.IndexedWithInt64, seg: ct.IndexedWithInt64,
                       dA_cumsum: ct.IndexedWithInt64, chunk_states: ct.IndexedWithInt64,
                       final_states: ct.IndexedWithInt64, CHUNK: ct.Constant[int],
                       BLOCK_P: ct.Constant[int], BLOCK_N: ct.Constant[int],
                       HAS_INITIAL_STATES: ct.Constant[bool], HAS_SEQ_IDX: ct.Constant[bool]):
    """One program: [BLOCK_P, BLOCK_N] of a (batch, head)'s chunk increments replaced in order by
    the states entering the chunks; grid (headdim blocks x dstate blocks, nheads, batch)."""
    i_pn = ct.bid(0)
    i_h = ct.bid(1)
    i_b = ct.bid(2)
    n_blocks = ct.cdiv(chunk_states.shape[4], BLOCK_N)
    i_p = i_pn // n_blocks
    i_n = i_pn % n_blocks
    END = CHUNK - 1  # a chunk's last position
    if HAS_INITIAL_STATES:
        S = ct.load(initial_states, (i_b, i_h, i_p, i_n), shape=(1, 1, BLOCK_P, BLOCK_N),
                    padding_mode=ct.PaddingMode.ZERO)
        S = ct.reshape(S, (BLOCK_P, BLOCK_N)).astype(ct.float32)  # 16-bit: widened, exact
    else:
        S = ct.zeros((BLOCK_P, BLOCK_N), dtype=ct.float32)
    seg_before = ct.zeros((1, 1), dtype=ct.int32)  # the initial state's segment: 0
    for i_c in range(dA_cumsum.shape[2]):
        # chunk_states in float32 or bfloat16: the increment widened (exact), the state carried
        # in float32 and stored rounded to chunk_states' dtype
        increment = ct.load(chunk_states, (i_b, i_c, i_h, i_p, i_n),
                            shape=(1, 1, 1, BLOCK_P, BLOCK_N),
                            padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        ct.store(chunk_states, (i_b, i_c, i_h, i_p, i_n),
                 ct.reshape(S, (1, 1, 1, BLOCK_P, BLOCK_N)).astype(chunk_states.dtype))
        # as in _fwd_pass_state_kernel: the decay over the whole chunk, and the state handed on
        # belongs to the segment of the chunk's last real token
        a_last = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, END), shape=(1, 1, 1, 1)), (1, 1))
        carry = ct.exp2(ct.minimum(a_last, 0.0))  # clamp: rounding must not make it > 1
        if HAS_SEQ_IDX:
            last = ct.minimum(i_c * CHUNK + END, seg.shape[1] - 1)
            seg_last = ct.load(seg, (i_b, last), shape=(1, 1))
            carry = ct.where(seg_last == seg_before, carry, 0.0)
            seg_before = seg_last
        S = S * carry + ct.reshape(increment, (BLOCK_P, BLOCK_N))
    ct.store(final_states, (i_b, i_h, i_p, i_n), ct.reshape(S, (1, 1, BLOCK_P, BLOCK_N)))


# The kernel objects: int32 or int64 indices (kernels.arrays.needs_int64; DECISIONS.md "Index
# width"); the state kernel also at two programs per SM (the rules' products of 128 tokens)
_fwd_pass_state = ct.kernel(int32_indexed(_fwd_pass_state_kernel))
_fwd_pass_state_two_per_sm = _fwd_pass_state.replace_hints(occupancy=RULES_OCCUPANCY_FULL_K)
_fwd_pass_state_int64 = ct.kernel(_fwd_pass_state_kernel)
_fwd_pass_state_int64_two_per_sm = _fwd_pass_state_int64.replace_hints(
    occupancy=RULES_OCCUPANCY_FULL_K)
_state_pass = ct.kernel(int32_indexed(_state_pass_kernel))
_state_pass_int64 = ct.kernel(_state_pass_kernel)
# by (int64 indices, occupancy hint), each made once here (an object made per call would be
# dispatched anew)
_KERNELS = {(False, None): _fwd_pass_state,
            (False, RULES_OCCUPANCY_FULL_K): _fwd_pass_state_two_per_sm,
            (True, None): _fwd_pass_state_int64,
            (True, RULES_OCCUPANCY_FULL_K): _fwd_pass_state_int64_two_per_sm}
_KERNELS.update({(int64, occ): _KERNELS[int64, None].replace_hints(occupancy=occ)
                 for int64 in (False, True) for occ in OCCUPANCIES
                 if (int64, occ) not in _KERNELS})


def _state_slices(headdim: int, dstate: int, block_p: int, block_n: int) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_N, slices): a program's state slice and the slices of one head's state."""
    block_p = pow2_tile(headdim, lo=MMA_MIN, hi=block_p)
    block_n = pow2_tile(dstate, lo=MMA_MIN, hi=block_n)
    return block_p, block_n, -(-headdim // block_p) * -(-dstate // block_n)


def in_order_programs(batch: int, nheads: int, headdim: int, dstate: int) -> int:
    """The programs of the rules' in-order grid: (headdim blocks x dstate blocks, nheads,
    batch)."""
    return _state_slices(headdim, dstate, RULES_BLOCK_P, RULES_BLOCK_N)[2] * nheads * batch


def rules_choice(dims: LaunchDims, sm_count) -> Choice:
    """The choice of the launcher's rules (RULES_*, PARALLEL_MIN_CHUNK) on a device of
    `sm_count` SMs (the dimensions alone)."""
    d = dims.dims
    parallel = (d.chunk_size >= PARALLEL_MIN_CHUNK
                and in_order_programs(d.batch, d.nheads, d.headdim, d.dstate) < sm_count)
    full_k = min(d.chunk_size, RULES_BLOCK_K) == RULES_BLOCK_K
    return Choice("parallel_chunks" if parallel else "in_order", RULES_BLOCK_K, RULES_BLOCK_P,
                  RULES_BLOCK_N, RULES_OCCUPANCY_FULL_K if full_k else None, RULES_PASS_BLOCK)


def fwd_pass_state_launches(x, B, dt_out, dA_cumsum, initial_states, seg, chunk_states,
                            final_states, sm_count, choice: Choice | None = None, *,
                            mode: str | None = None):
    """[(kernel, grid, kernel args)] of fwd_pass_state, in launch order: the chunks in order, or
    the chunks in parallel then the pass. The one place its tiles, its mode and its kernel
    objects (index width, occupancy) are chosen: `choice` where given (one of CHOICES, else a
    ValueError), else the rules' (rules_choice), in `mode` where given (one of MODES: the rules'
    tiles in that mode, as ssd_forward's explicit routes take them).

    Reads only shapes and the device's SM count, so the compile gate derives its signatures from
    here too. `seg` is the (batch, seqlen) int32 segment ids, or None.
    """
    batch, _, nheads, headdim = (int(s) for s in x.shape)
    dstate = int(B.shape[3])
    chunk_size, nchunks = int(dt_out.shape[3]), int(dt_out.shape[2])
    if mode is not None and (choice is not None or mode not in MODES):
        raise ValueError(f"mode: one of {MODES} without a choice, got {mode!r}"
                         f"{'' if choice is None else ' and a choice'}")
    if choice is None:
        choice = rules_choice(launch_dims(x, B, dt_out), sm_count)
        choice = choice if mode is None else choice._replace(mode=mode)
    elif choice not in CHOICES:
        raise ValueError(f"choice: {choice} is not one of fwd_pass_state's CHOICES")
    block_p, block_n, pn_blocks = _state_slices(headdim, dstate, choice.block_p, choice.block_n)
    block_k = min(chunk_size, choice.block_k)
    parallel = choice.mode == "parallel_chunks"
    initial = x if initial_states is None else initial_states  # a placeholder when absent
    seg_arg = dt_out if seg is None else seg
    args = (x, B, dt_out, dA_cumsum, initial, seg_arg, chunk_states, final_states,
            chunk_size, block_k, block_p, block_n, parallel, initial_states is not None,
            seg is not None)
    int64 = needs_int64(*args)
    kernel = _KERNELS[int64, choice.occupancy]
    if not parallel:
        return [(kernel, (pn_blocks, nheads, batch), args)]
    pass_p = pow2_tile(headdim, hi=choice.pass_block)
    pass_n = pow2_tile(dstate, hi=choice.pass_block)
    pass_grid = (-(-headdim // pass_p) * -(-dstate // pass_n), nheads, batch)
    pass_args = (initial, seg_arg, dA_cumsum, chunk_states, final_states, chunk_size,
                 pass_p, pass_n, initial_states is not None, seg is not None)
    return [(kernel, (nchunks * pn_blocks, nheads, batch), args),
            (_state_pass_int64 if int64 else _state_pass, pass_grid, pass_args)]


def fwd_pass_state(x, B, dt_out, dA_cumsum, initial_states=None, seq_idx=None, *,
                   choice: Choice | None = None, state_dtype=None):
    """(chunk_states, final_states) of the caller's array type: the state entering every chunk,
    (batch, nchunks, nheads, headdim, dstate), in `state_dtype` (float32, or bfloat16 for
    bfloat16 inputs, as ssd_forward takes it; None: float32), and the state after the last
    token, (batch, nheads, headdim, dstate), float32. x and B: float32, bfloat16 or float16,
    alike. `choice`: the Choice to launch (one of CHOICES, else a ValueError before any launch)
    instead of the rules' for this device."""
    def check(x, B, dt_out, dA_cumsum, initial_states, seq_idx):
        dims = check_fwd_pass_state_args(x, B, dt_out, dA_cumsum, initial_states=initial_states,
                                         seq_idx=seq_idx, float_dtypes=weight_dtypes(x),
                                         activation_dtypes=ACTIVATION_DTYPES)
        state_dtype_name(state_dtype, x)
        return dims

    narrow = lambda: state_dtype_name(state_dtype, x) not in (None, "float32")
    a = run_alone(
        "fwd_pass_state", dict(x=x, B=B, dt_out=dt_out, dA_cumsum=dA_cumsum,
                               initial_states=initial_states, seq_idx=seq_idx),
        check=check,
        outputs=lambda dims: {"chunk_states": (dims.shape("chunk_states"),
                                               "x" if narrow() else None),
                              "final_states": (dims.shape("final_states"), None)},
        launches=lambda a, backend, errors: fwd_pass_state_launches(
            a["x"], a["B"], a["dt_out"], a["dA_cumsum"], a["initial_states"], a["seg"],
            a["chunk_states"], a["final_states"], backend.sm_count, choice),
        word=False)  # it reads no value it could find bad
    return a["chunk_states"], a["final_states"]
