"""Bad input is refused with a ValueError / TypeError naming the argument, before any launch."""

import math

import numpy as np
import pytest

import contract
import kernels
from kernels import arrays, chunk_cumsum, compute_out, fwd_pass_state, ssd_forward, ssd_scan
from shapes import Case, make_inputs

CASE = Case("validation", 2, 40, 4, 8, 2, 16, 16)


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Any launch during these tests is a failure: validation must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was launched before the bad input was refused")
    monkeypatch.setattr(arrays.Backend, "launch", refuse)


@pytest.fixture
def kw():
    return make_inputs(CASE)


def f32(*shape):
    return np.ones(shape, dtype=np.float32)


def refused(error, match, fn, **kwargs):
    with pytest.raises(error, match=match):
        fn(**kwargs)


BAD_FORWARD = [
    # wrong ranks
    ("x_rank", "x", lambda kw: kw["x"][0], ValueError, "x must have 4 dimensions"),
    ("dt_rank", "dt", lambda kw: kw["dt"][..., None], ValueError, "dt must have 3 dimensions"),
    ("A_rank", "A", lambda kw: kw["A"][None], ValueError, "A must have 1 dimensions"),
    ("B_rank", "B", lambda kw: kw["B"][0], ValueError, "B must have 4 dimensions"),
    ("C_rank", "C", lambda kw: kw["C"][..., 0], ValueError, "C must have 4 dimensions"),
    ("D_rank", "D", lambda kw: f32(4, 8, 1), ValueError, "D must have"),
    ("z_rank", "z", lambda kw: kw["x"][0], ValueError, "z must have"),
    ("dt_bias_rank", "dt_bias", lambda kw: f32(4, 1), ValueError, "dt_bias must have"),
    ("initial_states_rank", "initial_states", lambda kw: f32(2, 4, 8), ValueError,
     "initial_states must have"),
    ("seq_idx_rank", "seq_idx", lambda kw: np.zeros(40, np.int32), ValueError, "seq_idx must have"),
    # mismatched shapes
    ("dt_seqlen", "dt", lambda kw: kw["dt"][:, :-1], ValueError, "dt must have shape"),
    ("B_seqlen", "B", lambda kw: kw["B"][:, :-1], ValueError, "B must have shape"),
    ("C_dstate", "C", lambda kw: kw["C"][..., :-1], ValueError, "C must have shape"),
    ("C_ngroups", "C", lambda kw: kw["C"][:, :, :1], ValueError, "C must have shape"),
    ("A_nheads", "A", lambda kw: kw["A"][:-1], ValueError, "A must have shape"),
    ("D_headdim", "D", lambda kw: f32(4, 7), ValueError, "D must have shape"),
    ("z_headdim", "z", lambda kw: kw["x"][..., :-1], ValueError, "z must have shape"),
    ("initial_states_dstate", "initial_states", lambda kw: f32(2, 4, 8, 15), ValueError,
     "initial_states must have shape"),
    ("seq_idx_seqlen", "seq_idx", lambda kw: np.zeros((2, 39), np.int32), ValueError,
     "seq_idx must have shape"),
    ("nheads_not_multiple_of_ngroups", "B", lambda kw: np.ones((2, 40, 3, 16), np.float32),
     ValueError, r"nheads \(4\) must be divisible by ngroups \(3"),
    # values
    ("A_zero", "A", lambda kw: np.zeros(4, np.float32), ValueError, "A must be < 0"),
    ("A_positive", "A", lambda kw: -kw["A"], ValueError, "A must be < 0"),
    ("A_nan", "A", lambda kw: np.full(4, np.nan, np.float32), ValueError, "A must be finite"),
    ("dt_bias_nan", "dt_bias", lambda kw: np.array([0, np.nan, 0, 0], np.float32), ValueError,
     "dt_bias must be finite"),
    ("dt_bias_inf", "dt_bias", lambda kw: np.array([0, np.inf, 0, 0], np.float32), ValueError,
     "dt_bias must be finite"),
    ("D_nan", "D", lambda kw: np.full(4, np.nan, np.float32), ValueError, "D must be finite"),
    # A is float32, as D and dt_bias (a float64 -1e-50 would reach the kernels as -0.0)
    ("A_float64", "A", lambda kw: np.full(4, -1e-50), TypeError,
     r"A must have a floating dtype in \('float32',\), got float64"),
    ("dt_limit_inverted", "dt_limit", lambda kw: (0.5, 0.1), ValueError, "dt_limit"),
    ("dt_limit_not_a_pair", "dt_limit", lambda kw: 0.5, TypeError, "dt_limit"),
    # dtypes (activations float32, bfloat16 or float16, all alike; the rest float32)
    ("x_float64", "x", lambda kw: kw["x"].astype(np.float64), TypeError, "x must have"),
    ("B_float16_x_float32", "B", lambda kw: kw["B"].astype(np.float16), TypeError,
     "B must have x.s dtype"),
    ("C_int", "C", lambda kw: kw["C"].astype(np.int32), TypeError, "C must have"),
    ("dt_float64", "dt", lambda kw: kw["dt"].astype(np.float64), TypeError, "dt must have"),
    ("z_float64", "z", lambda kw: kw["x"].astype(np.float64), TypeError, "z must have"),
    ("seq_idx_float", "seq_idx", lambda kw: np.zeros((2, 40), np.float32), TypeError, "seq_idx"),
    # chunk size
    ("chunk_size_48", "chunk_size", lambda kw: 48, ValueError, "chunk_size must be one of"),
    ("chunk_size_512", "chunk_size", lambda kw: 512, ValueError, "chunk_size must be one of"),
    ("chunk_size_float", "chunk_size", lambda kw: 64.0, TypeError, "chunk_size must be an int"),
    # not an array, a torch-less foreign object
    ("x_list", "x", lambda kw: kw["x"].tolist(), TypeError, "x"),
]


@pytest.mark.parametrize("arg,bad,error,match",
                         [pytest.param(*b[1:], id=b[0]) for b in BAD_FORWARD])
def test_ssd_forward_refuses(kw, arg, bad, error, match):
    kw[arg] = bad(kw)
    refused(error, match, ssd_forward, **kw)


def test_grid_limit_is_checked_before_launch():
    big = Case("grid", 65536, 1, 1, 1, 1, 1, 16)
    refused(ValueError, "batch must be <= 65535", ssd_forward, **make_inputs(big))


def test_chunk_cumsum_refuses(kw):
    refused(ValueError, "dt must have 3 dimensions", chunk_cumsum, dt=kw["x"], A=kw["A"],
            chunk_size=16)
    refused(ValueError, "A must be < 0", chunk_cumsum, dt=kw["dt"], A=-kw["A"], chunk_size=16)
    refused(ValueError, "chunk_size must be one of", chunk_cumsum, dt=kw["dt"], A=kw["A"],
            chunk_size=8)
    refused(TypeError, "dt must have", chunk_cumsum, dt=kw["dt"].astype(np.float64), A=kw["A"],
            chunk_size=16)
    refused(ValueError, "dt_bias must be finite", chunk_cumsum, dt=kw["dt"], A=kw["A"],
            chunk_size=16, dt_bias=np.full(4, np.inf, np.float32))


def test_vector_values_read_together(kw, monkeypatch):
    """A, D and dt_bias are read in one call (on a GPU, one wait for the queued work: the copies
    after the first find it drained)."""
    copies = []
    read = contract._host_vectors
    monkeypatch.setattr(contract, "_host_vectors", lambda *a: copies.append(len(a)) or read(*a))
    kw.update(D=-kw["A"], dt_bias=np.ones(4, np.float32))
    with pytest.raises(AssertionError, match="launched"):  # valid: checks pass, launch reached
        ssd_forward(**kw)
    assert copies == [3]


@pytest.mark.parametrize("stage", ["ssd_forward", "chunk_cumsum", "compute_out", "ssd_scan"])
def test_value_read_comes_last_before_the_launch(kw, monkeypatch, stage):
    """The value read (a synchronisation on a GPU: it waits for the queued work) follows every
    allocation and precedes the launch, so the GPU idles only for the launch after it."""
    events = []
    read = contract._host_vectors
    monkeypatch.setattr(contract, "_host_vectors", lambda *a: events.append("read") or read(*a))
    empty = arrays.Backend.empty
    monkeypatch.setattr(arrays.Backend, "empty",
                        lambda *a, **k: events.append("allocate") or empty(*a, **k))
    monkeypatch.setattr(arrays.Backend, "launch", lambda *a: events.append("launch"))
    kw["D"] = -kw["A"]
    if stage == "ssd_forward":  # the interpreter's forward: chunk_cumsum and the scan
        ssd_forward(**kw)
        allocations, launches = 4, 2
    elif stage == "chunk_cumsum":
        chunk_cumsum(kw["dt"], kw["A"], 16)
        allocations, launches = 2, 1
    elif stage == "ssd_scan":
        s = stage_kw(kw)
        ssd_scan(s["x"], kw["B"], kw["C"], s["dt_out"], s["dA_cumsum"], D=kw["D"])
        allocations, launches = 2, 1
    else:
        s = stage_kw(kw)
        compute_out(s["x"], kw["B"], kw["C"], s["dt_out"], s["dA_cumsum"],
                    f32(2, 3, 4, 8, 16), D=kw["D"])
        allocations, launches = 1, 1
    assert events == ["allocate"] * allocations + ["read"] + ["launch"] * launches


def test_check_values_false_skips_only_the_value_reads(kw, monkeypatch):
    """check_values=False reads no values (A > 0 goes through), but shapes are still checked."""
    def read(*arrays):
        raise AssertionError("values read despite check_values=False")
    monkeypatch.setattr(contract, "_host_vectors", read)
    kw["A"] = -kw["A"]
    with pytest.raises(AssertionError, match="launched"):
        ssd_forward(**kw, check_values=False)
    refused(ValueError, "A must have shape", ssd_forward, **dict(kw, A=kw["A"][:-1]),
            check_values=False)
    with pytest.raises(AssertionError, match="launched"):
        chunk_cumsum(kw["dt"], kw["A"], 16, check_values=False)


def stage_kw(kw):
    nchunks = -(-CASE.seqlen // CASE.chunk_size)
    return dict(x=kw["x"], B=kw["B"], dt_out=f32(2, 4, nchunks, 16),
                dA_cumsum=-f32(2, 4, nchunks, 16))


def test_fwd_pass_state_refuses(kw):
    s = stage_kw(kw)
    refused(ValueError, "dA_cumsum must have shape", fwd_pass_state,
            **dict(s, dA_cumsum=f32(2, 4, 3, 32)))
    refused(ValueError, "chunk_size must be one of", fwd_pass_state,
            **dict(s, dt_out=f32(2, 4, 5, 8), dA_cumsum=f32(2, 4, 5, 8)))
    refused(ValueError, "initial_states must have shape", fwd_pass_state, **s,
            initial_states=f32(2, 4, 8, 8))
    refused(TypeError, "dt_out must have", fwd_pass_state,
            **dict(s, dt_out=s["dt_out"].astype(np.float64)))


def test_compute_out_refuses(kw):
    s = stage_kw(kw)
    states = f32(2, 3, 4, 8, 16)
    refused(ValueError, "chunk_states must have shape", compute_out, **s, C=kw["C"],
            chunk_states=f32(2, 2, 4, 8, 16))
    refused(ValueError, "C must have shape", compute_out, **s, C=kw["C"][:, :, :1],
            chunk_states=states)
    refused(ValueError, "D must be finite", compute_out, **s, C=kw["C"], chunk_states=states,
            D=np.full((4, 8), np.nan, np.float32))
    refused(ValueError, "z must have shape", compute_out, **s, C=kw["C"], chunk_states=states,
            z=kw["x"][:, :-1])


@pytest.mark.gpu
def test_mixed_numpy_and_cupy_refused(kw):
    import cupy
    kw["B"] = cupy.asarray(kw["B"])
    refused(TypeError, "B is a cupy .* but x is a numpy", ssd_forward, **kw)
    refused(TypeError, "B is a cupy", fwd_pass_state, **dict(stage_kw(kw), B=kw["B"]))


@pytest.mark.gpu
def test_mixed_cupy_and_torch_refused(kw):
    import cupy
    torch = pytest.importorskip("torch")
    gpu = {k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    gpu["C"] = torch.from_numpy(kw["C"]).cuda()
    refused(TypeError, "C is a torch .* but x is a cupy", ssd_forward, **gpu)
    gpu["C"] = torch.from_numpy(kw["C"])  # a CPU tensor
    refused(TypeError, "C: a torch CPU tensor is not supported", ssd_forward, **gpu)


def test_public_names():
    assert set(kernels.__all__) == {"ssd_forward", "tune_forward", "chunk_cumsum", "fwd_pass_state",
                                    "compute_out", "ssd_scan", "raise_pending_errors"}
    assert math.isinf(ssd_forward.__defaults__[-3][1])  # dt_limit defaults to (0, inf)


def test_no_array_at_all_is_refused_by_name():
    with pytest.raises(TypeError, match="x must be an array, got None"):
        ssd_forward(None, None, None, None, None, 16)
