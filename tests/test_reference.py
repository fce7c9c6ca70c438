"""The float64 references: three forms of the forward agree, hand-worked values, extreme decays,
the per-kernel references compose, bad input is refused naming the argument."""

import math
import warnings

import numpy as np
import pytest

import reference as R
from properties.bounds import FLOAT64_REL, U_FP64, float64_chunked_rel

LOG2E = 1.0 / math.log(2.0)


def make_inputs(rng, *, batch=2, seqlen=100, nheads=4, headdim=8, ngroups=1, dstate=16,
                D=None, z=False, dt_mode="plain", initial_states=False, seq_idx=None):
    """Random inputs and keyword options of the forward; never all-zero."""
    x = rng.standard_normal((batch, seqlen, nheads, headdim))
    B = rng.standard_normal((batch, seqlen, ngroups, dstate))
    C = rng.standard_normal((batch, seqlen, ngroups, dstate))
    A = -np.exp(rng.uniform(math.log(0.5), math.log(8.0), nheads))
    kw = {}
    if dt_mode == "plain":  # processed dt = raw dt (the default clamp (0, inf) is inactive)
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(0.3), (batch, seqlen, nheads)))
    elif dt_mode == "negative_raw":  # the default clamp turns negative steps into 0
        dt = rng.uniform(-0.2, 0.3, (batch, seqlen, nheads))
    else:  # softplus of dt + dt_bias, the limit active at both ends, v > 20 included
        dt = rng.normal(-3.0, 3.0, (batch, seqlen, nheads))
        dt[:, ::17] = 25.0
        kw.update(dt_bias=rng.normal(0.0, 1.0, nheads), dt_softplus=True, dt_limit=(0.01, 1.5))
    if D == "head":
        kw["D"] = rng.standard_normal(nheads)
    elif D == "channel":
        kw["D"] = rng.standard_normal((nheads, headdim))
    if z:
        kw["z"] = 2.0 * rng.standard_normal((batch, seqlen, nheads, headdim))
    if initial_states:
        kw["initial_states"] = rng.standard_normal((batch, nheads, headdim, dstate))
    if seq_idx == "packed":
        # resets at token 1, at a chunk start (32), at the last token of a chunk (63), mid-chunk
        ids = np.zeros((batch, seqlen), dtype=np.int32)
        for start in (1, 32, 63, 70):
            ids[:, start:] += 1
        ids[1] = np.repeat(np.arange(4), -(-seqlen // 4))[:seqlen]  # another packing per row
        kw["seq_idx"] = ids
    elif seq_idx == "nonmonotonic":
        # ids that come back (3, 3, 7, 7, 3, ...): each run is its own sequence
        runs = rng.integers(1, 20, seqlen)
        ids = np.repeat(rng.choice([3, 7, 1], len(runs)), runs)[:seqlen]
        kw["seq_idx"] = np.stack([ids, ids[::-1]]).astype(np.int32)[:batch]
    return (x, dt, A, B, C), kw


CASES = {
    "baseline": (32, {}),
    "d_per_head": (32, dict(D="head")),
    "d_per_channel": (32, dict(D="channel")),
    "z_gate": (32, dict(z=True)),
    "dt_softplus_bias_limit": (32, dict(dt_mode="softplus_bias_limit")),
    "dt_negative_raw_clamped": (32, dict(dt_mode="negative_raw")),
    "initial_states": (32, dict(initial_states=True)),
    "seq_idx_packed": (32, dict(seq_idx="packed")),
    "seq_idx_nonmonotonic": (32, dict(seq_idx="nonmonotonic")),
    "seq_idx_with_initial_states": (32, dict(seq_idx="packed", initial_states=True)),
    "ngroups_2": (32, dict(ngroups=2)),
    "ngroups_equal_nheads": (32, dict(ngroups=4)),
    "seqlen_chunk_plus_1": (64, dict(seqlen=65)),
    "seqlen_chunk_minus_1": (64, dict(seqlen=63)),
    "seqlen_1": (16, dict(seqlen=1, initial_states=True, D="head")),
    **{f"chunk_{cs}": (cs, dict(seqlen=2 * cs + 5, nheads=2, initial_states=True))
       for cs in (16, 32, 64, 128, 256)},
    "all_options": (64, dict(seqlen=150, ngroups=2, D="channel", z=True,
                             dt_mode="softplus_bias_limit", initial_states=True,
                             seq_idx="nonmonotonic")),
}


def worst_ratio(a, b, M, rel=FLOAT64_REL):
    """max |a - b| / M over the elements, after checking |a - b| <= rel * M everywhere."""
    err = np.abs(a - b)
    assert np.all(err <= rel * M), f"max |a - b| - rel * M = {np.max(err - rel * M):.3e}"
    return float(np.max(np.where(M > 0, err / np.where(M > 0, M, 1.0), 0.0)))


@pytest.mark.parametrize("seed,chunk_size,options",
                         [pytest.param(seed, cs, options, id=name)
                          for seed, (name, (cs, options)) in enumerate(CASES.items())])
def test_three_forms_agree(seed, chunk_size, options, record_property):
    rng = np.random.default_rng(seed)
    args, kw = make_inputs(rng, **options)
    y_rec, final_rec = R.ssd_recurrent(*args, **kw)
    y_chk, final_chk = R.ssd_chunked(*args, chunk_size, **kw)
    y_quad = R.ssd_quadratic(*args, **kw)
    M = R.ssd_magnitude(*args, **kw)

    assert y_rec.dtype == y_chk.dtype == y_quad.dtype == M.dtype == np.float64
    assert y_rec.shape == y_chk.shape == y_quad.shape == M.shape == args[0].shape
    assert np.all(np.isfinite(y_rec)) and np.std(y_rec) > 0
    # M bounds y, so M > 0 wherever y != 0
    assert np.all(np.abs(y_rec) <= M * (1 + FLOAT64_REL))
    assert np.all((y_rec == 0) | (M > 0))

    x, dt, A, B, C = args
    dt_out, dA_cumsum = R.chunk_cumsum_ref(dt, A, chunk_size, kw.get("dt_bias"),
                                           kw.get("dt_softplus", False),
                                           kw.get("dt_limit", (0.0, math.inf)))
    _, final_M = R.fwd_pass_state_magnitude(x, B, dt_out, dA_cumsum, kw.get("initial_states"),
                                            kw.get("seq_idx"))
    worst = max(worst_ratio(y_rec, y_chk, M), worst_ratio(y_rec, y_quad, M),
                worst_ratio(y_chk, y_quad, M), worst_ratio(final_rec, final_chk, final_M),
                worst_ratio(M, R.ssd_magnitude(*args, chunk_size=chunk_size, **kw), M))
    record_property("worst_disagreement_over_M", worst)
    print(f"worst |a - b| / M = {worst:.3e}")


def test_hand_worked_three_tokens():
    """One head, headdim 1, dstate 1, A = -ln 2 so that exp(dt * A) = 2^-dt; D = 0.5, H_-1 = 4."""
    x = np.array([2.0, 3.0, -1.0]).reshape(1, 3, 1, 1)
    dt = np.array([1.0, 2.0, 1.0]).reshape(1, 3, 1)
    A = np.array([-math.log(2.0)])
    B = np.array([1.0, -1.0, 2.0]).reshape(1, 3, 1, 1)
    C = np.array([3.0, 2.0, 1.0]).reshape(1, 3, 1, 1)
    kw = dict(D=np.array([0.5]), initial_states=np.array([4.0]).reshape(1, 1, 1, 1))
    # t=0: H = 2^-1 * 4 + 1 * 2 * 1          = 4;    y = 4 * 3 + 0.5 * 2     = 13
    # t=1: H = 2^-2 * 4 + 2 * 3 * (-1)       = -5;   y = -5 * 2 + 0.5 * 3    = -8.5
    # t=2: H = 2^-1 * (-5) + 1 * (-1) * 2    = -4.5; y = -4.5 * 1 + 0.5 * -1 = -5
    expected_y, expected_final = [13.0, -8.5, -5.0], -4.5
    # with seq_idx (5, 5, 9) token 2 starts a new sequence: H = 0 + 1 * (-1) * 2 = -2;
    # y = -2 * 1 + 0.5 * -1 = -2.5 (tokens 0 and 1 unchanged)
    reset_y, reset_final = [13.0, -8.5, -2.5], -2.0
    seq_idx = np.array([[5, 5, 9]], dtype=np.int32)

    for want_y, want_final, extra in ((expected_y, expected_final, {}),
                                      (reset_y, reset_final, dict(seq_idx=seq_idx))):
        y_rec, final_rec = R.ssd_recurrent(x, dt, A, B, C, **kw, **extra)
        y_chk, final_chk = R.ssd_chunked(x, dt, A, B, C, 16, **kw, **extra)
        y_quad = R.ssd_quadratic(x, dt, A, B, C, **kw, **extra)
        for y in (y_rec, y_chk, y_quad):
            np.testing.assert_allclose(y.ravel(), want_y, rtol=1e-14)
        for final in (final_rec, final_chk):
            np.testing.assert_allclose(final.ravel(), [want_final], rtol=1e-14)


def test_hand_worked_z_gate():
    """z gate on one token, two channels: y = H * C = dt * x * B * C = 1 * 1 * 1 * 1 = 1; with
    z = 2 the output is 2 * sigmoid(2) = 2 / (1 + e^-2) = 1.7615941559557649, with z = -2 it is
    -2 * sigmoid(-2) = -2 / (1 + e^2) = -0.2384058440442351."""
    ones = np.ones((1, 1, 1, 2))
    z = np.array([2.0, -2.0]).reshape(1, 1, 1, 2)
    y, _ = R.ssd_recurrent(ones, np.ones((1, 1, 1)), np.array([-1.0]), ones[..., :1], ones[..., :1],
                           z=z)
    np.testing.assert_allclose(y.ravel(), [1.7615941559557649, -0.2384058440442351], rtol=1e-15)


def test_chunk_cumsum_hand_values_and_padding():
    """dt = (1, 2, 3), A = -1: dA_cumsum = -(1, 3, 6) * log2(e), then flat; dt_out = 0 beyond."""
    dt = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1)
    dt_out, dA_cumsum = R.chunk_cumsum_ref(dt, np.array([-1.0]), 16)
    assert dt_out.shape == dA_cumsum.shape == (1, 1, 1, 16)
    np.testing.assert_array_equal(dt_out.ravel(), [1.0, 2.0, 3.0] + [0.0] * 13)
    np.testing.assert_allclose(dA_cumsum.ravel(), [-1.4426950408889634, -4.328085122666890]
                               + [-8.656170245333781] * 14, rtol=1e-15)


def test_chunk_cumsum_softplus_bias_limit_hand_values():
    """raw (0, 24.5, -50) + bias 0.5 -> softplus: log(1 + e^0.5) = 0.9740769841801067,
    25 exactly (v > 20 is kept as is; log(1 + e^25) would be 25 + 1.4e-11), log1p(e^-49.5) =
    e^-49.5 to 1e-22 relative; clamp to (0.1, 10): 0.974..., 10, 0.1."""
    dt = np.array([0.0, 24.5, -50.0]).reshape(1, 3, 1)
    dt_out, _ = R.chunk_cumsum_ref(dt, np.array([-1.0]), 16, dt_bias=np.array([0.5]),
                                   dt_softplus=True, dt_limit=(0.1, 10.0))
    np.testing.assert_allclose(dt_out.ravel()[:3], [0.9740769841801067, 10.0, 0.1], rtol=1e-15)
    dt_out, _ = R.chunk_cumsum_ref(dt, np.array([-1.0]), 16, dt_bias=np.array([0.5]),
                                   dt_softplus=True)
    np.testing.assert_allclose(dt_out.ravel()[:3], [0.9740769841801067, 25.0, math.exp(-49.5)],
                               rtol=1e-15)


def test_chunk_cumsum_layout():
    """dt_out[b, h, c, i] is the step of token c * chunk_size + i of head h (dt > 0 unclamped)."""
    rng = np.random.default_rng(13)
    (_, dt, A, _, _), _ = make_inputs(rng, batch=2, seqlen=40, nheads=3)
    dt_out, dA_cumsum = R.chunk_cumsum_ref(dt, A, 16)
    assert dt_out.shape == (2, 3, 3, 16)
    for b, h, t in [(0, 0, 0), (1, 2, 17), (0, 1, 39), (1, 0, 32)]:
        c, i = divmod(t, 16)
        assert dt_out[b, h, c, i] == dt[b, t, h]
        np.testing.assert_allclose(dA_cumsum[b, h, c, i],
                                   np.sum(dt[b, 16 * c:t + 1, h]) * A[h] * LOG2E, rtol=1e-14)
    np.testing.assert_array_equal(dt_out[:, :, 2, 8:], 0.0)


def test_groups_and_per_channel_skip():
    """Head h reads group h // (nheads // ngroups): each head of a 2-group forward is the
    one-head forward on its group; a per-channel D adds exactly D[h, p] * x."""
    rng = np.random.default_rng(17)
    (x, dt, A, B, C), kw = make_inputs(rng, seqlen=30, nheads=4, ngroups=2, D="channel",
                                       initial_states=True)
    D, init = kw["D"], kw["initial_states"]
    y, final = R.ssd_recurrent(x, dt, A, B, C, initial_states=init)
    y_D, _ = R.ssd_recurrent(x, dt, A, B, C, D=D, initial_states=init)
    M = R.ssd_magnitude(x, dt, A, B, C, D=D, initial_states=init)
    worst_ratio(y_D - y, D * x, M)
    for h in range(4):
        g = h // 2
        heads, group = slice(h, h + 1), slice(g, g + 1)
        y_h, final_h = R.ssd_recurrent(x[:, :, heads], dt[:, :, heads], A[heads], B[:, :, group],
                                       C[:, :, group], initial_states=init[:, heads])
        np.testing.assert_array_equal(y_h, y[:, :, heads])
        np.testing.assert_array_equal(final_h, final[:, heads])


@pytest.mark.parametrize("chunk_size", [16, 64, 256])
def test_chunk_cumsum_non_increasing_within_chunk(chunk_size):
    rng = np.random.default_rng(chunk_size)
    (_, dt, A, _, _), kw = make_inputs(rng, seqlen=3 * chunk_size - 7,
                                       dt_mode="softplus_bias_limit")
    dt_out, dA_cumsum = R.chunk_cumsum_ref(dt, A, chunk_size, kw["dt_bias"], True, kw["dt_limit"])
    assert dA_cumsum.shape == (2, 4, 3, chunk_size)
    assert np.all(dA_cumsum <= 0.0)
    assert np.all(np.diff(dA_cumsum, axis=-1) <= 0.0)
    assert np.all(dt_out >= 0.0)
    # log2 units: each chunk starts at dt_0 * A * log2(e)
    np.testing.assert_allclose(dA_cumsum[..., 0], dt_out[..., 0] * A[None, :, None] * LOG2E,
                               rtol=1e-15)


@pytest.mark.parametrize("options", [dict(initial_states=True),
                                     dict(seq_idx="packed", initial_states=True),
                                     dict(seq_idx="nonmonotonic", ngroups=2)],
                         ids=["initial_states", "seq_idx_packed", "seq_idx_nonmonotonic_ngroups_2"])
def test_per_kernel_references_compose(options):
    """chunk_states[:, c] equals the recurrent state after token c * chunk_size - 1."""
    chunk_size = 16
    rng = np.random.default_rng(7)
    (x, dt, A, B, C), kw = make_inputs(rng, seqlen=75, **options)
    dt_out, dA_cumsum = R.chunk_cumsum_ref(dt, A, chunk_size)
    init, seq_idx = kw.get("initial_states"), kw.get("seq_idx")
    chunk_states, final_states = R.fwd_pass_state_ref(x, B, dt_out, dA_cumsum, init, seq_idx)
    M_states, M_final = R.fwd_pass_state_magnitude(x, B, dt_out, dA_cumsum, init, seq_idx)
    assert chunk_states.shape == (2, 5, 4, 8, 16)
    assert np.all(M_states >= np.abs(chunk_states))

    np.testing.assert_array_equal(chunk_states[:, 0], 0.0 if init is None else init)
    for c in range(1, chunk_states.shape[1]):
        end = c * chunk_size
        _, state = R.ssd_recurrent(x[:, :end], dt[:, :end], A, B[:, :end], C[:, :end],
                                   initial_states=init,
                                   seq_idx=None if seq_idx is None else seq_idx[:, :end])
        worst_ratio(chunk_states[:, c], state, M_states[:, c])
    _, state = R.ssd_recurrent(x, dt, A, B, C, initial_states=init, seq_idx=seq_idx)
    worst_ratio(final_states, state, M_final)

    # compute_out_ref on those states is the chunked forward's output, and its magnitude bounds it
    y = R.compute_out_ref(x, B, C, dt_out, dA_cumsum, chunk_states, seq_idx=seq_idx)
    M = R.compute_out_magnitude(x, B, C, dt_out, dA_cumsum, chunk_states, seq_idx=seq_idx)
    y_rec, _ = R.ssd_recurrent(x, dt, A, B, C, initial_states=init, seq_idx=seq_idx)
    worst_ratio(y, y_rec, M)


@pytest.mark.parametrize("seq_idx", ["packed", "nonmonotonic"])
def test_seq_idx_segments_are_independent_sequences(seq_idx):
    """Each run of equal seq_idx is the forward of that run alone (initial state: first run only).
    Checks the reset semantics that the three forms share, against the plain recurrence."""
    rng = np.random.default_rng(11)
    (x, dt, A, B, C), kw = make_inputs(rng, seqlen=90, seq_idx=seq_idx, initial_states=True,
                                       D="head")
    ids = kw.pop("seq_idx")
    y, _ = R.ssd_chunked(x, dt, A, B, C, 16, seq_idx=ids, **kw)
    M = R.ssd_magnitude(x, dt, A, B, C, seq_idx=ids, **kw)
    for b in range(x.shape[0]):
        starts = [0] + [t for t in range(1, x.shape[1]) if ids[b, t] != ids[b, t - 1]]
        assert len(starts) > 2
        for i, (lo, hi) in enumerate(zip(starts, starts[1:] + [x.shape[1]])):
            init = kw["initial_states"][b:b + 1] if i == 0 else None
            run = [a[b:b + 1, lo:hi] for a in (x, dt)]
            y_run, _ = R.ssd_recurrent(*run, A, B[b:b + 1, lo:hi], C[b:b + 1, lo:hi],
                                       D=kw["D"], initial_states=init)
            worst_ratio(y[b:b + 1, lo:hi], y_run, M[b:b + 1, lo:hi])


def extreme_inputs(rng, dt_softplus):
    """dt up to 1e3 and dt * A down to -1e4 (A = -10 with dt = 1e3), every option on."""
    (x, dt, A, B, C), kw = make_inputs(rng, seqlen=70, ngroups=2, D="channel", z=True,
                                       initial_states=True, seq_idx="packed")
    A = np.array([-10.0, -1.0, -1e-3, -1e-1])
    dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e3), dt.shape))
    dt[:, ::9] = 1e3
    if dt_softplus:  # raw values of both signs far beyond the softplus threshold
        dt[:, 1::9] = -1e3
        kw.update(dt_softplus=True, dt_bias=np.array([0.5, -0.5, 1.0, 0.0]))
    kw["z"][:, ::5] = 1e3 * np.sign(kw["z"][:, ::5])
    return (x, dt, A, B, C), kw


@pytest.mark.parametrize("dt_softplus", [False, True], ids=["dt_raw", "dt_softplus"])
def test_extreme_decays_finite_without_warnings(dt_softplus):
    rng = np.random.default_rng(3)
    args, kw = extreme_inputs(rng, dt_softplus)
    x, dt, A, B, C = args
    assert np.min(dt[..., 0] * A[0]) == -1e4
    # Overflow, invalid (NaN) and division are errors. Underflow is not: 2^(dt * A) for
    # dt * A = -1e4 is below the smallest double, and 0 is its correctly rounded value.
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise",
                                                under="ignore"):
        warnings.simplefilter("error")
        y_rec, final_rec = R.ssd_recurrent(*args, **kw)
        y_quad = R.ssd_quadratic(*args, **kw)
        M = R.ssd_magnitude(*args, **kw)
        results = [y_rec, final_rec, y_quad, M]
        for chunk_size in (16, 64, 256):
            y_chk, final_chk = R.ssd_chunked(*args, chunk_size, **kw)
            M_chk = R.ssd_magnitude(*args, chunk_size=chunk_size, **kw)
            results += [y_chk, final_chk, M_chk]
            _, dA_cumsum = R.chunk_cumsum_ref(dt, A, chunk_size, kw.get("dt_bias"),
                                              kw.get("dt_softplus", False))
            worst = worst_ratio(y_rec, y_chk, M, float64_chunked_rel(chunk_size, dA_cumsum))
            print(f"chunk {chunk_size}: worst |y_rec - y_chk| / M = {worst:.3e} "
                  f"= {worst / (U_FP64 * np.max(np.abs(dA_cumsum))):.2f} u max|dA_cumsum|")
    for r in results:
        assert np.all(np.isfinite(r))
    worst_ratio(y_rec, y_quad, M)
    assert np.max(np.abs(y_rec)) > 1.0


def test_inputs_of_any_float_dtype_are_upcast():
    """float16/float32 inputs give exactly the float64 result on the same (exactly representable)
    values."""
    rng = np.random.default_rng(5)
    args, kw = make_inputs(rng, seqlen=40, D="head", z=True, initial_states=True)
    want, want_final = R.ssd_chunked(*[a.astype(np.float16).astype(np.float64) for a in args], 16,
                                     **{k: v.astype(np.float16).astype(np.float64)
                                        for k, v in kw.items()})
    for dtype in (np.float16, np.float32):
        low = [a.astype(np.float16).astype(dtype) for a in args]
        low_kw = {k: v.astype(np.float16).astype(dtype) for k, v in kw.items()}
        y, final = R.ssd_chunked(*low, 16, **low_kw)
        assert y.dtype == final.dtype == np.float64
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(final, want_final)


def _bad_input_cases():
    rng = np.random.default_rng(9)
    (x, dt, A, B, C), _ = make_inputs(rng, seqlen=40)
    dt_out, dA = R.chunk_cumsum_ref(dt, A, 16)
    states, _ = R.fwd_pass_state_ref(x, B, dt_out, dA)
    nan_A, zero_A = A.copy(), A.copy()
    nan_A[0], zero_A[1] = np.nan, 0.0
    B3 = rng.standard_normal((2, 40, 3, 16))
    # id: (error, the message's start or key phrase, the call)
    return {
        "x_wrong_rank": (ValueError, "^x must have 4",
                         lambda: R.ssd_recurrent(x[..., 0], dt, A, B, C)),
        "x_int_dtype": (TypeError, "^x must",
                        lambda: R.ssd_quadratic(x.astype(np.int32), dt, A, B, C)),
        "B_seqlen_mismatch": (ValueError, "^B must",
                              lambda: R.ssd_chunked(x, dt, A, B[:, :-1], C, 16)),
        "C_shape_mismatch": (ValueError, "^C must",
                             lambda: R.ssd_recurrent(x, dt, A, B, C[..., :-1])),
        "nheads_not_divisible_by_ngroups": (ValueError, "divisible by ngroups",
                                            lambda: R.ssd_chunked(x, dt, A, B3, B3, 16)),
        "A_zero": (ValueError, "^A must be < 0",
                   lambda: R.ssd_quadratic(x, dt, zero_A, B, C)),
        "A_nan": (ValueError, "^A must be finite",
                  lambda: R.chunk_cumsum_ref(dt, nan_A, 16)),
        "A_wrong_shape": (ValueError, "^A must have shape",
                          lambda: R.chunk_cumsum_ref(dt, A[:-1], 16)),
        "chunk_size_48": (ValueError, "^chunk_size must be one of",
                          lambda: R.ssd_chunked(x, dt, A, B, C, 48)),
        "chunk_size_float": (TypeError, "^chunk_size must be an int",
                             lambda: R.chunk_cumsum_ref(dt, A, 64.0)),
        "dt_out_chunk_size_48": (ValueError, "^chunk_size must be one of",
                                 lambda: R.fwd_pass_state_ref(x, B, np.ones((2, 4, 1, 48)),
                                                              np.ones((2, 4, 1, 48)))),
        "dA_cumsum_shape_mismatch": (ValueError, "^dA_cumsum must",
                                     lambda: R.fwd_pass_state_ref(x, B, dt_out, dA[:, :, :-1])),
        "chunk_states_shape_mismatch": (ValueError, "^chunk_states must",
                                        lambda: R.compute_out_ref(x, B, C, dt_out, dA,
                                                                  states[:, :-1])),
        "initial_states_shape_mismatch": (ValueError, "^initial_states must",
                                          lambda: R.ssd_recurrent(x, dt, A, B, C,
                                                                  initial_states=states[:, 0, 1:])),
        "D_wrong_shape": (ValueError, "^D must",
                          lambda: R.compute_out_ref(x, B, C, dt_out, dA, states, D=np.ones(3))),
        "dt_bias_nan": (ValueError, "^dt_bias must be finite",
                        lambda: R.ssd_recurrent(x, dt, A, B, C, dt_bias=np.full(4, np.nan))),
        "dt_limit_lo_above_hi": (ValueError, "^dt_limit",
                                 lambda: R.ssd_quadratic(x, dt, A, B, C, dt_limit=(1.0, 0.5))),
        "seq_idx_float": (TypeError, "^seq_idx must be int32",
                          lambda: R.ssd_magnitude(x, dt, A, B, C, seq_idx=np.ones((2, 40)))),
        "z_shape_mismatch": (ValueError, "^z must",
                             lambda: R.compute_out_magnitude(x, B, C, dt_out, dA, states,
                                                             z=x[:, :-1])),
    }


BAD_INPUT_CASES = _bad_input_cases()


@pytest.mark.parametrize("case", BAD_INPUT_CASES.values(), ids=BAD_INPUT_CASES.keys())
def test_bad_input_is_refused_naming_the_argument(case):
    error, match, call = case
    with pytest.raises(error, match=match):
        call()
