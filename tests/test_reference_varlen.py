"""The packed variable-length reference (reference/varlen.py): the three forms agree on a packed
row with per-sequence initial and final states; without initial states, the packed row is the
seq_idx forward of the same row; empty sequences keep their state; bad cu_seqlens is refused
naming it."""

import numpy as np
import pytest

import reference as R
from reference._common import gate
from tests.test_reference import make_inputs, worst_ratio

CHUNK = 16
# a 140-token row: an empty sequence first, lengths 1, chunk - 1, chunk, chunk + 1, an empty one
# in the middle, one of several chunks, the rest (41 tokens)
LENGTHS = (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 0, 3 * CHUNK + 2, 41)
CU_SEQLENS = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)


def _packed(rng, **options):
    (x, dt, A, B, C), kw = make_inputs(rng, batch=1, seqlen=int(CU_SEQLENS[-1]), ngroups=2,
                                       **options)
    kw.pop("initial_states", None)
    return (x, dt, A, B, C), kw


def _magnitudes(args, cu_seqlens, init, kw):
    """(M of y, M of varlen_states): the packed reference on absolute values (decays unchanged),
    y's times |z sigmoid(z)|: every term of an output is a product of those factors."""
    x, dt, A, B, C = args
    abs_ = lambda a: None if a is None else np.abs(a)
    M, M_states = R.ssd_varlen_ref(np.abs(x), dt, A, np.abs(B), np.abs(C), cu_seqlens,
                                   initial_states=abs_(init), **{**kw, "D": abs_(kw.get("D")),
                                                                 "z": None})
    if kw.get("z") is not None:
        M = M * np.abs(gate(kw["z"]))
    return M, M_states


@pytest.mark.parametrize("initial", [False, True], ids=["zero_initial", "per_sequence_initial"])
def test_three_forms_agree_on_a_packed_row(initial):
    rng = np.random.default_rng(21)
    args, kw = _packed(rng, D="channel", z=True, dt_mode="softplus_bias_limit")
    x, _, _, B, _ = args
    init = (rng.standard_normal((len(LENGTHS), x.shape[2], x.shape[3], B.shape[3]))
            if initial else None)
    y_rec, s_rec = R.ssd_varlen_ref(*args, CU_SEQLENS, initial_states=init, **kw)
    M, M_states = _magnitudes(args, CU_SEQLENS, init, kw)
    for form in ("chunked", "quadratic"):
        y, s = R.ssd_varlen_ref(*args, CU_SEQLENS, form=form, chunk_size=CHUNK,
                                initial_states=init, **kw)
        worst_ratio(y, y_rec, M)
        worst_ratio(s, s_rec, M_states)
    # an empty sequence's state is its initial state (or zeros), untouched
    for k in np.flatnonzero(np.asarray(LENGTHS) == 0):
        assert np.array_equal(s_rec[k], init[k] if initial else np.zeros_like(s_rec[k]))


def test_a_packed_row_without_initial_states_is_the_seq_idx_forward():
    """Zero initial states: y is the row's forward with seq_idx the sequence of each token, and
    the last non-empty sequence's state is that forward's final state."""
    rng = np.random.default_rng(22)
    args, kw = _packed(rng, D="head")
    seq_idx = np.repeat(np.arange(len(LENGTHS)), LENGTHS)[None].astype(np.int32)
    y, states = R.ssd_varlen_ref(*args, CU_SEQLENS, **kw)
    y_row, final_row = R.ssd_recurrent(*args, seq_idx=seq_idx, **kw)
    M, M_states = _magnitudes(args, CU_SEQLENS, None, kw)
    worst_ratio(y, y_row, M)
    worst_ratio(states[-1:], final_row, M_states[-1:])


def _bad_cases():
    rng = np.random.default_rng(23)
    args, _ = _packed(rng)
    x, _, _, B, _ = args
    n = len(LENGTHS)
    two_rows = [np.concatenate([a, a]) for a in args[:2]] + [args[2]] + [
        np.concatenate([a, a]) for a in args[3:]]
    return {
        "cu_seqlens_not_starting_at_0": (ValueError, "^cu_seqlens must start at 0",
                                         dict(cu=CU_SEQLENS + 1)),
        "cu_seqlens_decreasing": (ValueError, "^cu_seqlens must be non-decreasing",
                                  dict(cu=CU_SEQLENS[[0, 2, 1, 3, 4, 5, 6, 7, 8]])),
        "cu_seqlens_not_ending_at_seqlen": (ValueError, "^cu_seqlens must end at seqlen",
                                            dict(cu=np.append(CU_SEQLENS[:-1], 139))),
        "cu_seqlens_float": (TypeError, "^cu_seqlens must be int32 or int64",
                             dict(cu=CU_SEQLENS.astype(np.float32))),
        "cu_seqlens_2d": (ValueError, "^cu_seqlens must have 1 dimensions",
                          dict(cu=CU_SEQLENS[None])),
        "cu_seqlens_one_offset": (ValueError, "^cu_seqlens must hold",
                                  dict(cu=CU_SEQLENS[:1])),
        "cu_seqlens_batch_2": (ValueError, "^cu_seqlens packs sequences in one row",
                               dict(args=two_rows)),
        "initial_states_wrong_count": (ValueError, "^initial_states must have shape \\(num_seqs",
                                       dict(init=np.ones((n - 1, x.shape[2], x.shape[3],
                                                          B.shape[3])))),
    }, args


BAD_CASES, _BAD_ARGS = _bad_cases()


@pytest.mark.parametrize("case", BAD_CASES.values(), ids=BAD_CASES.keys())
def test_bad_cu_seqlens_is_refused_naming_it(case):
    error, match, change = case
    with pytest.raises(error, match=match):
        R.ssd_varlen_ref(*change.get("args", _BAD_ARGS), change.get("cu", CU_SEQLENS),
                         initial_states=change.get("init"))
