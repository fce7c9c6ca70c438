"""Error bounds against the float64 reference, the kernels' and the float64 forms': every
tolerance lives here.

The a-priori bound (spec, "Numerical facts"): with M the same forward computed in float64 on
|x|, |B|, |C|, |D|, |initial_states| (decays and dt unchanged), a correct TF32 kernel satisfies,
per element, |y - y_ref| <= kappa * u * M (+ the two small terms below), u = 2^-11.

Derivation of kappa: count the roundings on every path from an input to an output
------------------------------------------------------------------------------------
Every term of y is a product of factors (C, B, dt, x, a decay 2^e; or C, a state, a decay; or
D, x). A relative perturbation (1 + d) of one factor of every term moves y by at most |d| * M,
because M is the sum of the same terms in absolute value. So per output element:

    |y - y_ref| <= (sum over the roundings r on the worst path of |d_r|) * M

TF32 operand roundings (|d| <= u = 2^-11 each; round to nearest, ct.astype(ct.tfloat32)):
  compute_out, intra-chunk path:  C -> tf32, B -> tf32 (C B^T), (C B^T o L * dt) -> tf32,
                                  x -> tf32 ((C B^T o L dt) x)                         4 roundings
  compute_out, carried path:      C -> tf32, S -> tf32 (C S^T)                         2 roundings
  compute_out, earlier token blocks of the chunk, where a program carries the state through
  the chunk (layout whole_chunks): (w o x) -> tf32, B -> tf32 (the block's increment of
                                  the state), S -> tf32, C -> tf32 (C S^T)             4 roundings
  fwd_pass_state, every increment: x -> tf32, (B * w) -> tf32 (x^T (B w))              2 roundings
  end to end, carried path:       the state's own 2 (fwd_pass_state) + C S^T's 2       4 roundings
  end to end, intra path:         as compute_out                                       4 roundings
  skip term D x, z gate:          fp32 only                                            0
So the TF32 part of kappa is 4 for compute_out and the forward, 2 for fwd_pass_state.

fp32 work (unit u32 = 2^-24 = u / 8192), counted per path and added to kappa in units of u:
  - additions in fp32 accumulators: at most n = seqlen (the state accumulates every token's
    increment, each rounding's error decays with the state afterwards, so it stays <= u32 * M)
    + chunk_size (the intra-chunk sum) + 2 * dstate (C B^T and C S^T) + 3 * nchunks (carry
    products, the skip add, and with fwd_pass_state's chunks in parallel the addition of each
    chunk's increment to the carried state) + 3 per token block of a chunk (compute_out's
    whole_chunks layout: at each block boundary a carry 2^(a_last - a_before), 2 ulp, its
    product and the addition of the block's increment; blocks of >= MIN_BLOCK_T tokens; counted
    for every stage and layout, an over-estimate elsewhere) per output. There a term's decay
    2^(a_t - a_s) is a product of per-block factors whose exponents share a sign and add up to
    a_t - a_s: their roundings add up to at most u32 |a_t - a_s|, as for one difference, and
    the cumsum's own errors cancel between consecutive factors. Tensor cores do not promise IEEE
    round-to-nearest in their accumulation (truncation in the alignment of the addends), so
    each addition gets 2 u32: 2 n u32.
  - exp2 (ex2.approx: 2 ulp), the exponent difference a_t - a_s (1 rounding of a number <= 150 in
    magnitude wherever the factor is not below fp32's range: relative error <= ln2 * 150 u32),
    the products dt * 2^e, cb * L * dt, the z gate, the dt processing (softplus, bias: C_DT =
    100 u32, below): 2 + 104 + 100 + ~10 < FP32_FIXED = 256 u32 for the fixed chain.
  kappa(stage, ...) = TF32 roundings + (2 n + FP32_FIXED) * u32 / u. At the ci profile's largest
  sizes (seqlen 300, chunk 256, dstate 64) the fp32 part is 0.21; at (4096, 256, 256) it is 1.24.

Two terms the relative count does not cover, both zero in ordinary cases:
  - decay_term: the forward's dA_cumsum is itself an fp32 cumulative sum. Its error at token t
    is <= gamma * |a_t| (gamma = (chunk_size + C_DT + 2) u32, any summation order, every addend of
    one sign), so the exponent a_t - a_s of a term can be off by gamma * (2 Lambda + E), Lambda =
    the largest in-chunk |a| and E = a_s - a_t >= 0 the true exponent (the carried path crosses
    whole chunks, each adding its own gamma * |a_last| <= part of E). A relative exponent error
    becomes the factor's relative error times ln 2. Summed over terms:
        expm1(2 ln2 gamma Lambda) * M + gamma * sum_terms(m * 2^-E * E ln2) * e^(...)
    and sum_terms(m 2^-E E ln2) = -dM/dlambda at lambda = 1 (M with every decay scaled by
    lambda) <= (M(1 - eta) - M(1)) / eta since M is convex in lambda: one more magnitude run
    with A * (1 - eta). Only decays of thousands per chunk make this term count; there it is
    honest (fp32 cannot hold a_t - a_s better once |a_t| ~ 1e4).
  - ftz_floor: anything under 2^-126 may be flushed to zero (spec). A flushed intermediate loses
    < 2^-126 and is multiplied afterwards by at most the largest of the remaining factors:
    FTZ_MIN * (seqlen + 1) * (dstate + 1) * prod(1 + max|factor|).

A bf16 intermediate (u_bf16 = 2^-8 = 8 u) alone adds up to 8 u per term: the bound at kappa ~ 4.2
leaves it no room (tests/test_properties.py and the mutants check that it is caught). 16-bit
inputs take a bound of their own (below: "16-bit products").
"""

from __future__ import annotations

import math

import numpy as np

from kernels.tiles import MMA_MIN

U_TF32 = 2.0 ** -11  # unit roundoff of a TF32 operand: 10-bit mantissa, round to nearest
U_FP32 = 2.0 ** -24  # unit roundoff of fp32 arithmetic and accumulation
FTZ_MIN = 2.0 ** -126  # smallest normal fp32: below it the GPU may flush to zero

TF32_ROUNDINGS = {"fwd_pass_state": 2, "compute_out": 4, "forward": 4}

# fp32 roundings per addition in an accumulator (tensor cores: 2 u32, see above)
ACCUMULATION_U32 = 2
# the fixed fp32 chain of a path (exp2, exponent difference, products, dt processing), in u32
FP32_FIXED = 256
# relative error of the processed dt in u32: bias add 1; e^v for -88 <= v <= 20 (below -88 the
# step is under 2^-126 and the flush-to-zero allowance covers it), computed as 2^(v log2 e): the
# argument's rounding costs |v| u32 relative, ex2.approx 2 ulp: <= 90; log1p in Goldberg's form
# passes e's error with a factor <= 1 and adds log, product, quotient: ~6; the clamp is exact.
# 100 with margin (1/80 of u: the dt path never matters at TF32 scale, but a naive log(1 + e^v),
# thousands of u32 off for v < -10, fails chunk_cumsum's bound)
C_DT = 100
# the step of the secant for -dM/dlambda (any eta in (0, 1) is an upper bound by convexity)
DECAY_ETA = 1.0 / 16.0


# compute_out's and ssd_scan's smallest token block: the most block boundaries a chunk's state
# crosses in the whole_chunks layout is chunk_size / MIN_BLOCK_T; ssd_scan carries its state
# across every token block of the sequence, seqlen / MIN_BLOCK_T boundaries at most, each a
# carry (its exp2 and its product) and an accumulator add, as a chunk boundary of fwd_pass_state
MIN_BLOCK_T = MMA_MIN


def accumulation_length(seqlen: int, chunk_size: int, dstate: int) -> int:
    """The number n of fp32 additions on the longest path to one output (see the derivation)."""
    nchunks = -(-seqlen // chunk_size)
    return (seqlen + chunk_size + 2 * dstate + 3 * nchunks + 3 * (chunk_size // MIN_BLOCK_T)
            + 3 * -(-seqlen // MIN_BLOCK_T))


def kappa(stage: str, seqlen: int, chunk_size: int, dstate: int,
          operands: str = "tfloat32", stored_states: bool = False) -> float:
    """kappa of `stage` ('forward', 'compute_out', 'fwd_pass_state') at these sizes, in units
    of U_TF32, for products of `operands` ('tfloat32': float32 inputs; 'bfloat16' or 'float16':
    16-bit inputs, see "16-bit products" below); `stored_states`: the chunk states stored in
    bfloat16 (ssd_forward's state_dtype; "bfloat16 chunk states" below)."""
    n = accumulation_length(seqlen, chunk_size, dstate)
    fp32 = (ACCUMULATION_U32 * n + FP32_FIXED) * U_FP32 / U_TF32
    if operands == "tfloat32":
        return TF32_ROUNDINGS[stage] + fp32
    k = NARROW_ROUNDINGS[stage] + (STORED_STATE_ROUNDINGS[stage] if stored_states else 0)
    u = U_NARROW[operands]
    return k * (1.0 + k * u) * u / U_TF32 + fp32


# 16-bit products (x, B, C, z in bfloat16 or float16): the derivation
# -------------------------------------------------------------------
# Every product of 16-bit inputs takes 16-bit operands with an fp32 accumulator
# (kernels.tiles.mma_operand, mma_product): the inputs as they are (x, B, C: no rounding), the
# values the kernels compute rounded once (u_n = 2^-8 to bfloat16; 2^-11 to float16, as TF32
# rounds them: scaled into range first, or in ssd_scan guarded, a call out of range redone on
# TF32 operands, "Scaled float16 operands" below; round to nearest): compute_out's decayed
# weights (C B^T o L) * dt and its state operand S, fwd_pass_state's scaled w o x (ssd_scan
# and ssd_varlen: the same three). Per path:
#   compute_out, intra-chunk path:  (C B^T o L * dt) rounded (C B^T itself exact in fp32)   1
#   compute_out, carried path:      S rounded (C is exact)                                 1
#   fwd_pass_state, every increment: (w o x) rounded (B is exact)                          1
#   end to end, carried path:       the state's 1 + S's 1                                    2
#   end to end, intra path:         1
# (the program per chunk runs float32 inputs only). k roundings of |d| <= u_n move a term by
# at most (1 + u_n)^k - 1 <= k u_n (1 + k u_n), so the 16-bit part of kappa is
# k (1 + k u_n) u_n / u in units of u = U_TF32 (bfloat16: about 16.1 for the forward; float16:
# about 2.0), plus the same fp32 part as above; y's store adds u_n |y| (narrow_output_bound).
# An 8-bit intermediate (u = 2^-4, 16 u_bf16) or an accumulator kept in 16 bits (a rounding per
# addition) exceeds it.
NARROW_ROUNDINGS = {"fwd_pass_state": 1, "compute_out": 1, "forward": 2}
# unit roundoff of a 16-bit value: bfloat16 keeps 7 explicit mantissa bits, float16 (and TF32) 10
U_NARROW = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}

# Scaled float16 operands: the derivation
# ---------------------------------------
# fwd_pass_state's, compute_out's and ssd_varlen's computed float16 operands (S, the decayed
# weights, w o x) are scaled per row or column by 2^(140 - e), e the float32 exponent of that
# row's (column's) largest magnitude m, which then lies in [2^13, 2^14): no value rounds past
# 65504 (kernels.tiles.float16_scaled). The factors are powers of two: scaling and scaling the
# product back are exact. A value v at or above float16's smallest normal (2^-14 scaled, >=
# 2^-27 m unscaled) rounds with |d| <= 2^-11 |v|, as TF32 rounds it: the relative count above.
# Below it float16's subnormals (spacing 2^-24, scaled) leave |d| <= 2^-25 2^(e - 140) <= 2^-38
# m: an absolute error, which a product carries to an output times the other operand's
# magnitude, summed over the product's length, whatever the row's other values.
# ssd_scan rounds the same three unscaled (guarded instead: a result that is not finite makes
# its second launch recompute with TF32 operands, float32's products): a value below 2^-14
# keeps |d| <= 2^-25, absolute. With X, Bm, Cm, dt, Z the largest |x|, |B|, |C|, dt_out, |z|
# (the gate multiplies an error by at most 1 + Z), S <= (the largest state magnitude) +
# chunk_size dt X Bm (a state inside a chunk: its start and the chunk's increments, decays <=
# 1), W <= dstate Bm Cm dt (a decayed weight), w o x <= dt X, per output, e the absolute error
# of one operand value (2^-38 times the value's bound, scaled; 2^-25, unscaled):
#   carried path:   dstate * e(S) * Cm          (C S^T)
#   intra path:     chunk_size * e(W) * X       (x^T W)
#   state updates:  seqlen * e(dt X) * Bm        (every token's w o x, into the state), and
#                   into y through C: times (1 + dstate Cm)
# float16_floor gives y both designs' sums times (1 + Z) and the final states their state
# updates alone (an S or W operand's rounding reaches y only). It is an allowance for the worst
# case, every token's w o x subnormal with no decay: where the values are far from float16's
# subnormals it is small beside the relative count, but with large B and C its y part can
# reach kappa u M (the properties' weights-past-65504 case), so an 8-bit operand (2^-8, 8 times
# the relative count) is caught on the many elements below it, not on the worst; an operand
# left unscaled and unguarded goes inf past 65504: both fail (forward_fp16_bound; mutants
# float16_operand_unscaled, float16_scan_unguarded, float16_operand_8_bit).
FLOAT16_SUBNORMAL = 2.0 ** -38  # a scaled float16 operand's absolute error, in its row's m
FLOAT16_SUBNORMAL_UNSCALED = 2.0 ** -25  # an unscaled one's: half float16's smallest subnormal


def float16_floor(seqlen: int, chunk_size: int, dstate: int, x: float, B: float, C: float,
                  dt: float, states: float, z: float) -> tuple[float, float]:
    """Absolute allowances (y, final states) for float16 operands' subnormals, scaled or not
    (see the derivation): the arguments after the sizes are the largest magnitudes of x, B, C,
    dt_out, the states, z."""
    S = states + chunk_size * dt * x * B
    W = dstate * B * C * dt
    updates = seqlen * B * (FLOAT16_SUBNORMAL * dt * x + FLOAT16_SUBNORMAL_UNSCALED)
    operands = (FLOAT16_SUBNORMAL * (dstate * S * C + chunk_size * W * x)
                + FLOAT16_SUBNORMAL_UNSCALED * (dstate * C + chunk_size * x))
    return (operands + updates * (1.0 + dstate * C)) * (1.0 + z), updates

# bfloat16 chunk states (state_dtype bfloat16 for bfloat16 inputs, on the three-kernel path):
# the derivation
# ------------------------------------------------------------------------------------------
# fwd_pass_state in order carries its state in fp32 registers and stores each chunk's entering
# state rounded to bfloat16; compute_out reads it as its state operand, which it would round to
# bfloat16 anyway: the store's rounding is S's operand rounding, counted above, and y is
# bit-identical to that of float32 chunk states. With the chunks in parallel, each chunk's
# increment is stored rounded too before the pass adds it to the carried fp32 state: one more
# rounding of every term on the carried path, so the forward's and the final state's count
# grows by one (compute_out alone, given its states, by none). A chunk state fwd_pass_state
# returns holds, beyond that, its own store's rounding: narrow_output_bound of the chunk states'
# bound, as for y. The scan and the packed path keep no chunk states.
STORED_STATE_ROUNDINGS = {"fwd_pass_state": 1, "compute_out": 0, "forward": 1}


# The constant for tests up to 4096 tokens, chunk 256 and dstate 256 (every kernel test of the
# project stays inside); larger shapes take kappa(...) of their own sizes.
KAPPA = kappa("forward", 4096, 256, 256)


def tf32_bound(M, kappa_value: float = KAPPA):
    """Per-element bound on |y - y_ref| for a TF32 kernel, given the magnitude M."""
    return kappa_value * U_TF32 * M


def cumsum_gamma(chunk_size: int) -> float:
    """Relative error bound of the kernel's dA_cumsum: |a_kernel - a| <= gamma * |a| per entry
    (fp32 cumsum of chunk_size terms of one sign, any order: (chunk_size - 1) u32; each addend
    dt * (A log2 e): dt's C_DT u32 and 2 products)."""
    return (chunk_size - 1 + C_DT + 2) * U_FP32


def chunk_cumsum_bound(dt_out_ref, dA_cumsum_ref, chunk_size: int):
    """(bound on |dt_out - ref|, bound on |dA_cumsum - ref|), per element, for the kernel fed
    fp32-exact dt, A, dt_bias: C_DT u32 relative on dt, cumsum_gamma relative on the cumsum."""
    dt_bound = C_DT * U_FP32 * np.abs(dt_out_ref)
    return dt_bound, cumsum_gamma(chunk_size) * np.abs(dA_cumsum_ref)


def decay_term(M, M_weaker, chunk_size: int, max_chunk_decay: float):
    """The forward's extra bound from the fp32 dA_cumsum (see the derivation).

    `M_weaker`: the magnitude with every A scaled by (1 - DECAY_ETA); `max_chunk_decay`:
    Lambda, the largest in-chunk |dA_cumsum| (log2 units) of the reference.
    """
    gamma = cumsum_gamma(chunk_size)
    a = 2.0 * math.log(2.0) * gamma * max_chunk_decay
    # E ln2 gamma <= 150 ln2 gamma wherever the factor is above fp32 range: e^that < 1.002
    slope = np.maximum(M_weaker - M, 0.0) / DECAY_ETA
    # 1.01: also the cross term with the TF32 roundings ((1 + kappa u)(1 + d) - 1)
    return 1.01 * (math.expm1(a) * M + math.exp(a) * gamma * slope)


# The float64 forms against each other (tests/test_reference.py) and a float64 implementation
# against the reference (the PyTorch baseline of benchmarks/torch_ssd.py): |a - b| <= REL * M per
# element. Every term of y is a product of factors that M takes in absolute value, so a relative
# rounding u64 anywhere on a term's path moves y by at most u64 * M; the longest chain of
# sequential roundings (decay products, sums over tokens, dstate, the chunk) is
# n <= seqlen + dstate + chunk_size <= ~800 in those tests, n * u64 <= 9e-14. The chunked form adds
# the exponent error of float64_chunked_rel below; for the decays of the random cases
# (|dt * A| <= 2.4 per token) it is measured <= 0.4 u64 max|a| ~ 1e-14 (its worst case, all
# roundings aligned, is larger: float64_chunked_rel). 1e-12 is the figure; the worst
# measured over the reference tests' table is ~3e-14.
U_FP64 = 2.0 ** -53
FLOAT64_REL = 1e-12


def float64_chunked_rel(chunk_size: int, dA_cumsum) -> float:
    """FLOAT64_REL plus the worst-case exponent error of the chunked form, for extreme decays.

    The chunked form takes 2^(a_t - a_s) as a difference of in-chunk cumsums. The cumsum's
    rounding at step k is <= u64 * |a_k|, and only the t - s steps between s and t enter
    a_t - a_s: an absolute exponent error <= chunk_size * u64 * max|a|, i.e. a relative error
    <= ln 2 * chunk_size * u64 * max|a| of that term, hence of y relative to M. With dt * A down
    to -1e4, max|a| reaches ~2e5 and this term dominates (the quadratic and recurrent forms have
    no such term: their segment sums and decay products never subtract two large numbers).
    """
    return FLOAT64_REL + math.log(2.0) * chunk_size * U_FP64 * float(np.max(np.abs(dA_cumsum)))


# Narrow inputs (x, B, C, z in bfloat16 or float16; dt, A, D, dt_bias, initial_states float32;
# y in the inputs' dtype): the derivation
# ------------------------------------------------------------------------------------------
# The bound of the float32 result is kappa's for 16-bit inputs (above: "16-bit products"). So
# with y_ref the float64 forward of the narrow inputs' own values (upcast, not the float32 data
# they were rounded from), the float32 result y32 the kernel holds before its store satisfies
# that bound b: |y32 - y_ref| <= b. The store rounds y32 to the narrow format, to nearest:
#     |y - y32| <= u_narrow * |y32| <= u_narrow * (|y_ref| + b)
# (u_bf16 = 2^-8: 7 explicit mantissa bits; u_fp16 = 2^-11: 10 bits), plus, below the normal
# range, half the subnormal spacing in absolute terms (float16 below 2^-14: 2^-25; bfloat16 has
# float32's range, where a flush to zero loses < 2^-126). Hence, per element,
#     |y - y_ref| <= b + u_narrow * (|y_ref| + b) + floor_narrow
# while |y| stays below the format's largest finite number (float16: 65504; beyond it y is
# inf, which fails every check). final_states stays float32: no store rounding (its kappa is
# the 16-bit one, with bfloat16 chunk states' extra rounding where they are kept).
NARROW_FLOOR = {"bfloat16": FTZ_MIN, "float16": 2.0 ** -25}


def narrow_output_bound(y_ref, fp32_bound, dtype: str):
    """Per-element bound on |y - y_ref| for y stored in `dtype` ('float32', 'bfloat16',
    'float16'), given the float32 bound `fp32_bound` of the same inputs (see the derivation)."""
    if dtype == "float32":
        return fp32_bound
    return fp32_bound + U_NARROW[dtype] * (np.abs(y_ref) + fp32_bound) + NARROW_FLOOR[dtype]


# A comparator with narrow inputs (the benchmarks' side-by-side mamba_ssm) need not compute in
# float32: mamba_ssm rounds its decayed weights C B^T o L * dt and its chunk states to the input
# dtype before the products that use them, and returns the final states in that dtype. Its path
# then has the same roundings as ours, each of unit u_n = u_narrow instead of u, and the final
# states one store rounding more. The float32 bound is first order, sum |d_r| * M; with k
# roundings of |d| <= u_n the exact factor is (1 + u_n)^k - 1 <= k u_n (1 + k u_n) for
# k u_n <= 1, so the float32 bound scaled by (u_n / u) (1 + KAPPA u_n) covers the comparator.
# The cuTile kernels' own bound is tighter: 2 bfloat16 roundings on a path, not KAPPA's 4 scaled.
def comparator_narrow_bounds(y_ref, final_ref, fp32_y_bound, fp32_final_bound, dtype: str):
    """(y bound, final_states bound) for a side-by-side implementation with `dtype` inputs that
    keeps its intermediates in that dtype (see above); float32: the float32 bounds."""
    if dtype == "float32":
        return fp32_y_bound, fp32_final_bound
    scale = U_NARROW[dtype] / U_TF32 * (1.0 + KAPPA * U_NARROW[dtype])
    return (narrow_output_bound(y_ref, scale * fp32_y_bound, dtype),
            narrow_output_bound(final_ref, scale * fp32_final_bound, dtype))


def ftz_floor(seqlen: int, dstate: int, *factor_maxima: float) -> float:
    """Absolute allowance for intermediates flushed to zero (see the derivation)."""
    growth = math.prod(1.0 + float(f) for f in factor_maxima)
    return FTZ_MIN * (seqlen + 1) * (dstate + 1) * growth
