"""ssd_forward on packed rows (cu_seqlens, kernels/ssd_varlen.py): y and each sequence's final
state against the float64 reference of separate calls per sequence (reference.ssd_varlen_ref),
with per-sequence initial states and empty sequences; bad cu_seqlens refused by name before any
launch, or (values the host does not read) NaN states and a named error."""

import math

import ml_dtypes
import numpy as np
import pytest

import reference as R
from kernels import raise_pending_errors, ssd_forward
from properties.bounds import KAPPA
from properties.runner import outputs_filled_with, to_host
from properties.strategies import to_backend
from shapes import BACKENDS, check_within, on_backend, recorded_launches

CHUNK = 16
# an empty sequence first, lengths 1, chunk - 1, chunk, chunk + 1, an empty one in the middle,
# several chunks, then the rest: sequences start and end anywhere in the row's token blocks
LENGTHS = (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 0, 3 * CHUNK + 2, 41)
CU_SEQLENS = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)


def _inputs(seed=0, nheads=4, headdim=24, ngroups=2, dstate=16, options=True):
    rng = np.random.default_rng(seed)
    L, h, p, g, n = int(CU_SEQLENS[-1]), nheads, headdim, ngroups, dstate
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    kw = dict(x=f32(rng.standard_normal((1, L, h, p))),
              dt=f32(np.exp(rng.uniform(math.log(1e-3), math.log(0.3), (1, L, h)))),
              A=f32(-np.exp(rng.uniform(math.log(0.5), math.log(8.0), h))),
              B=f32(rng.standard_normal((1, L, g, n))), C=f32(rng.standard_normal((1, L, g, n))),
              chunk_size=CHUNK)
    if options:
        kw.update(D=f32(rng.standard_normal((h, p))), z=f32(rng.standard_normal((1, L, h, p))),
                  initial_states=f32(rng.standard_normal((len(LENGTHS), h, p, n))))
    return kw


def _reference(kw):
    """(y, varlen_states) of separate calls per sequence, and their magnitudes M."""
    args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], CU_SEQLENS)
    opts = dict(D=kw.get("D"), z=kw.get("z"), initial_states=kw.get("initial_states"))
    y, states = R.ssd_varlen_ref(*args, **opts)
    abs_ = lambda a: None if a is None else np.abs(a)
    M, M_states = R.ssd_varlen_ref(np.abs(kw["x"]), kw["dt"], kw["A"], np.abs(kw["B"]),
                                   np.abs(kw["C"]), CU_SEQLENS, D=abs_(opts["D"]),
                                   initial_states=abs_(opts["initial_states"]))
    if opts["z"] is not None:
        z = opts["z"].astype(np.float64)
        M = M * np.abs(z / (1.0 + np.exp(-z)))
    return y, states, M, M_states


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [False, True], ids=["no_options", "D_z_initial_states"])
@pytest.mark.usefixtures("nan_filled_outputs")
def test_packed_row_matches_separate_sequences(backend, options, request):
    kw = _inputs(options=options)
    y_ref, states_ref, M, M_states = _reference(kw)
    with recorded_launches() as launches:
        y, states = ssd_forward(**on_backend(backend, kw), cu_seqlens=on_backend(
            backend, {"c": CU_SEQLENS})["c"], return_varlen_states=True)
    assert [name for name, _, _ in launches] == ["_chunk_cumsum_kernel", "_ssd_varlen_kernel",
                                                 "_ssd_varlen_refused_kernel"]
    check_within("y", y, y_ref, M, KAPPA, request.node.name)
    check_within("varlen_states", states, states_ref, M_states, KAPPA, request.node.name)
    empty = np.flatnonzero(np.asarray(LENGTHS) == 0)
    init = kw.get("initial_states")
    for k in empty:  # an empty sequence's state is its initial state (or zeros), untouched
        want = init[k] if init is not None else np.zeros_like(states_ref[k])
        assert np.array_equal(to_host(states)[k], want)


def test_return_value_follows_mamba_ssm():
    kw = _inputs(options=False)
    y = ssd_forward(**kw, cu_seqlens=CU_SEQLENS)
    y2, states = ssd_forward(**kw, cu_seqlens=CU_SEQLENS, return_varlen_states=True)
    assert np.array_equal(y, y2) and states.shape == (len(LENGTHS), 4, 24, 16)
    assert states.dtype == np.float32


def test_seq_idx_given_with_cu_seqlens_must_be_each_tokens_sequence():
    kw = _inputs(options=False)
    seq_idx = np.repeat(np.arange(len(LENGTHS)), LENGTHS)[None].astype(np.int32)
    y = ssd_forward(**kw, seq_idx=seq_idx, cu_seqlens=CU_SEQLENS)
    assert np.array_equal(y, ssd_forward(**kw, cu_seqlens=CU_SEQLENS))
    wrong = seq_idx.copy()
    wrong[0, 5] += 1
    with recorded_launches() as launches, pytest.raises(ValueError, match="^seq_idx"):
        ssd_forward(**kw, seq_idx=wrong, cu_seqlens=CU_SEQLENS)
    assert not launches


def _bad_calls():
    kw = _inputs(options=False)
    two_rows = {k: np.concatenate([v, v]) if k in ("x", "dt", "B", "C") else v
                for k, v in kw.items()}
    h0 = np.ones((len(LENGTHS) - 1, 4, 24, 16), np.float32)
    return {
        "cu_seqlens_float": (TypeError, "^cu_seqlens must be int32 or int64",
                             dict(kw, cu_seqlens=CU_SEQLENS.astype(np.float32))),
        "cu_seqlens_batch_2": (ValueError, "^cu_seqlens packs sequences in one row",
                               dict(two_rows, cu_seqlens=CU_SEQLENS)),
        "initial_states_wrong_count": (ValueError, "^initial_states must have shape \\(num_seqs",
                                       dict(kw, cu_seqlens=CU_SEQLENS, initial_states=h0)),
        "varlen_states_without_cu_seqlens": (ValueError, "^return_varlen_states",
                                             dict(kw, return_varlen_states=True)),
        "final_states_with_cu_seqlens": (ValueError, "^return_final_states",
                                         dict(kw, cu_seqlens=CU_SEQLENS,
                                              return_final_states=True)),
        "cu_seqlens_not_starting_at_0": (ValueError, "^cu_seqlens must start at 0",
                                         dict(kw, cu_seqlens=CU_SEQLENS + 1)),
        "cu_seqlens_decreasing": (ValueError, "^cu_seqlens must be non-decreasing",
                                  dict(kw, cu_seqlens=CU_SEQLENS[[0, 2, 1, 3, 4, 5, 6, 7, 8]])),
        "cu_seqlens_not_ending_at_seqlen": (ValueError, "^cu_seqlens must end at seqlen",
                                            dict(kw, cu_seqlens=np.append(CU_SEQLENS[:-1],
                                                                          CU_SEQLENS[-1] - 1))),
    }


BAD_CALLS = _bad_calls()


@pytest.mark.parametrize("case", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_input_is_refused_by_name_before_any_launch(case):
    error, match, kw = case
    with recorded_launches() as launches, pytest.raises(error, match=match):
        ssd_forward(**kw)
    assert not launches


def _bad_offsets(bad: str) -> np.ndarray:
    """CU_SEQLENS wrong in one way, as the host does not read it (check_values=False)."""
    cu = CU_SEQLENS.astype(np.int64)
    if bad == "decreasing_past_seqlen":  # sequence 6 ends past seqlen, 7 ends before it starts
        cu[-2] = cu[-1] + 10
    elif bad == "short_end":  # the last sequence ends short of seqlen: 5 tokens are no one's
        cu[-1] -= 5
    elif bad == "not_starting_at_0":  # sequences 0 and 1 empty at token 1: token 0 is no one's
        cu[:2] = 1
    else:  # int64 offsets whose int32 wrap (2^32 + 49 -> 49) would look right: refused as such
        cu[4] += 2**32
        return cu
    return cu.astype(np.int32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bad", ["decreasing_past_seqlen", "short_end", "not_starting_at_0",
                                 "int64_wrapping_to_plausible"])
def test_bad_offsets_unread_by_the_host_give_nan_and_a_named_error(bad, dtype, backend):
    """The kernel finds the offsets: all of y and every state NaN (the good sequences' too:
    which tokens no sequence covers is not known), and the error names cu_seqlens; headdim 100
    (two headdim blocks) and dstate 20 (a padded dstate tile), float32 and bfloat16 inputs (on
    the GPU as torch tensors). The outputs start finite, so the NaN is the kernels'. (Offsets
    whose sequences overlap would leave the overlap to whichever program writes last before
    the NaN; the interpreter refuses such a race outright.)"""
    kw = _inputs(options=False, headdim=100, dstate=20)
    cu = _bad_offsets(bad)
    if dtype == "bfloat16":
        kw.update({k: kw[k].astype(ml_dtypes.bfloat16) for k in ("x", "B", "C")})
        backend = "torch" if backend == "gpu" else backend
    kw = {k: to_backend(v, backend) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    with outputs_filled_with(0.0):
        y, states = ssd_forward(**kw, cu_seqlens=to_backend(cu, backend),
                                return_varlen_states=True, check_values=False)
    y, states = to_host(y).astype(np.float32), to_host(states)
    assert np.isnan(y).all() and np.isnan(states).all()
    with pytest.raises(ValueError, match="cu_seqlens must start at 0, be non-decreasing"):
        raise_pending_errors()


@pytest.mark.usefixtures("nan_filled_outputs")
def test_good_offsets_leave_no_error_and_no_nan():
    """The refusal's kernel writes nothing where the offsets are good (y is not filled before
    the kernels, so every token is the sequences')."""
    kw = _inputs(options=True)
    y, states = ssd_forward(**kw, cu_seqlens=CU_SEQLENS, return_varlen_states=True,
                            check_values=False)
    assert not np.isnan(y).any() and not np.isnan(states).any()
    raise_pending_errors()


@pytest.mark.parametrize("backend, num_seqs", [
    pytest.param("interpreter", 40, id="interpreter_40_sequences"),
    pytest.param("gpu", 300, id="gpu_300_sequences", marks=pytest.mark.gpu),
])
@pytest.mark.usefixtures("nan_filled_outputs")
def test_many_short_sequences_in_a_row(backend, num_seqs, request):
    """Many sequences of 0 to 2 chunks (empty ones included), each from its own initial state:
    y and every state against the separate calls' reference."""
    rng = np.random.default_rng(num_seqs)
    lengths = rng.integers(0, 2 * CHUNK + 1, num_seqs)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    L, h, p, n = int(cu[-1]), 2, 16, 16
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    kw = dict(x=f32(rng.standard_normal((1, L, h, p))),
              dt=f32(np.exp(rng.uniform(math.log(1e-3), math.log(0.3), (1, L, h)))),
              A=f32(-np.exp(rng.uniform(math.log(0.5), math.log(8.0), h))),
              B=f32(rng.standard_normal((1, L, 1, n))), C=f32(rng.standard_normal((1, L, 1, n))),
              initial_states=f32(rng.standard_normal((num_seqs, h, p, n))))
    args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], cu)
    y_ref, states_ref = R.ssd_varlen_ref(*args, initial_states=kw["initial_states"])
    M, M_states = R.ssd_varlen_ref(np.abs(kw["x"]), kw["dt"], kw["A"], np.abs(kw["B"]),
                                   np.abs(kw["C"]), cu,
                                   initial_states=np.abs(kw["initial_states"]))
    y, states = ssd_forward(**on_backend(backend, dict(kw, cu_seqlens=cu)), chunk_size=CHUNK,
                            return_varlen_states=True)
    check_within("y", y, y_ref, M, KAPPA, request.node.name)
    check_within("varlen_states", states, states_ref, M_states, KAPPA, request.node.name)
