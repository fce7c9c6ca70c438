"""Bad values of A, D and dt_bias found by the kernels (kernels/errors.py): every output they
feed is NaN, the error is raised naming the argument by a later call or raise_pending_errors(),
later good calls are not blamed; the default GPU call reads no value on the host."""

import math

import numpy as np
import pytest

import contract
from kernels import chunk_cumsum, compute_out, errors, raise_pending_errors, ssd_forward
from kernels.compute_out import compute_out_choices
from properties.runner import to_host
from properties.strategies import to_backend
from shapes import Case, make_inputs

CASE = Case("errors", 2, 40, 3, 8, 1, 8, 16, D="head", dt="softplus")
BACKENDS = ["interpreter", pytest.param("gpu", marks=pytest.mark.gpu),
            pytest.param("torch", marks=pytest.mark.gpu)]
# (argument, index, bad value, the heads whose outputs it feeds)
BAD = [
    pytest.param("A", 1, 0.5, [1], id="A_positive"),
    pytest.param("A", 2, 0.0, [2], id="A_zero"),
    pytest.param("A", 0, -math.inf, [0], id="A_minus_inf"),
    pytest.param("A", 1, math.nan, [1], id="A_nan"),
    pytest.param("dt_bias", 2, math.inf, [2], id="dt_bias_inf"),
    pytest.param("dt_bias", 0, math.nan, [0], id="dt_bias_nan"),
    pytest.param("D", 1, math.inf, [1], id="D_inf"),
    pytest.param("D", 2, math.nan, [2], id="D_nan"),
]
MESSAGE = {"A": "A must be finite and < 0", "dt_bias": "dt_bias must be finite",
           "D": "D must be finite"}


@pytest.fixture(autouse=True)
def nothing_pending():
    """Each test starts and ends with no error pending (a failed test leaves none behind)."""
    raise_pending_errors()
    yield
    try:
        raise_pending_errors()
    except ValueError:
        pass


def backend_of(a) -> str:
    kind = type(a).__module__.split(".")[0]
    return {"numpy": "interpreter", "cupy": "gpu"}.get(kind, kind)


def inputs(backend, case=CASE):
    return {k: to_backend(v, backend) if isinstance(v, np.ndarray) else v
            for k, v in make_inputs(case).items()}


def with_bad(kw, name, index, value):
    bad = to_host(kw[name]).copy()
    bad[index] = value
    return dict(kw, **{name: to_backend(bad, backend_of(kw[name]))})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, index, value, heads", BAD)
def test_a_bad_value_gives_nan_outputs_and_a_named_error_later(backend, name, index, value,
                                                               heads):
    kw = inputs(backend)
    y_good, final_good = (to_host(a) for a in ssd_forward(**kw, return_final_states=True))
    y, final = ssd_forward(**with_bad(kw, name, index, value), return_final_states=True,
                           check_values=False)
    y, final = to_host(y), to_host(final)
    others = [h for h in range(CASE.nheads) if h not in heads]
    assert np.isnan(y[:, :, heads]).all()
    # the other heads are untouched: bit-identical to the good call's
    assert np.array_equal(y[:, :, others], y_good[:, :, others])
    if name == "D":  # D feeds y alone
        assert np.array_equal(final, final_good)
    else:
        assert np.isnan(final[:, heads]).all()
        assert np.array_equal(final[:, others], final_good[:, others])
    with pytest.raises(ValueError, match=f"{MESSAGE[name]}.*ssd_forward \\(call #"):
        raise_pending_errors()
    # reported once: the next good call is not blamed and gives the good call's results
    y_after = ssd_forward(**kw)
    assert np.array_equal(to_host(y_after), y_good)
    raise_pending_errors()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bad_channel_of_D_gives_nan_in_that_channel_alone(backend):
    """D per channel over two of chunk_cumsum's D blocks (headdim 70), a bad channel in the
    second; ssd_forward checks D in chunk_cumsum (its first chunk's programs) and compute_out
    makes that channel's y NaN in every chunk and batch element."""
    case = Case("errors_D_channel", 2, 70, 4, 70, 2, 8, 16, D="channel")
    kw = inputs(backend, case)
    y_good = to_host(ssd_forward(**kw))
    y = to_host(ssd_forward(**with_bad(kw, "D", (3, 66), math.inf), check_values=False))
    assert np.isnan(y[..., 3, 66]).all()
    y[..., 3, 66] = y_good[..., 3, 66]
    assert np.array_equal(y, y_good)
    with pytest.raises(ValueError, match="D must be finite.*ssd_forward"):
        raise_pending_errors()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_next_call_raises_an_earlier_calls_error_before_launching(backend, monkeypatch):
    kw = inputs(backend)
    ssd_forward(**with_bad(kw, "A", 0, 1.0), check_values=False)
    if backend != "interpreter":
        import cupy
        cupy.cuda.runtime.deviceSynchronize()  # so that the next call can see it
    from kernels import arrays
    monkeypatch.setattr(arrays.Backend, "launch_parts", lambda *a: pytest.fail("launched"))
    with pytest.raises(ValueError, match=r"A must be finite and < 0 .*\(call #\d+\)"):
        ssd_forward(**kw)
    monkeypatch.undo()
    ssd_forward(**kw)  # reported once
    raise_pending_errors()


def test_the_interpreter_checks_on_the_host_at_once_by_default():
    kw = inputs("interpreter")
    with pytest.raises(ValueError, match="A must be < 0"):
        ssd_forward(**with_bad(kw, "A", 0, 1.0))
    with pytest.raises(ValueError, match="D must be finite"):
        ssd_forward(**with_bad(kw, "D", 0, math.nan))
    raise_pending_errors()  # nothing was launched, nothing is pending


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunk_cumsum_alone_reports_its_bad_heads(backend):
    kw = inputs(backend)
    bad = with_bad(with_bad(kw, "A", 0, math.nan), "dt_bias", 2, math.inf)
    dt_out, dA = (to_host(a) for a in chunk_cumsum(
        bad["dt"], bad["A"], 16, bad["dt_bias"], True, kw["dt_limit"], check_values=False))
    assert np.isnan(dt_out[:, [0, 2]]).all() and np.isnan(dA[:, [0, 2]]).all()
    assert np.isfinite(dt_out[:, 1]).all() and np.isfinite(dA[:, 1]).all()
    with pytest.raises(ValueError, match="A must be finite.*dt_bias must be finite.*chunk_cumsum"):
        raise_pending_errors()


@pytest.mark.parametrize("backend", BACKENDS)
def test_compute_out_reports_a_bad_D_in_every_choice(backend):
    """Each program layout and heads-per-program choice (the program per chunk reads D once per
    program, the program per token block per block) gives NaN in the bad channel alone."""
    case = Case("errors_whole_chunks", 1, 130, 4, 8, 1, 16, 64, D="channel")
    kw = inputs(backend, case)
    dt_out, dA = chunk_cumsum(kw["dt"], kw["A"], case.chunk_size)
    nchunks = -(-case.seqlen // case.chunk_size)
    states = to_backend(np.random.default_rng(1).standard_normal(
        (1, nchunks, 4, 8, 16)).astype(np.float32), backend)
    bad = with_bad(kw, "D", (2, 5), math.nan)
    choices = compute_out_choices(kw["x"], kw["B"], kw["C"], dt_out, dA, states, bad["D"], None,
                                  None, kw["x"])
    assert {c.layout for c in choices} == {"token_blocks", "whole_chunks"}
    for choice in choices:
        y = to_host(compute_out(kw["x"], kw["B"], kw["C"], dt_out, dA, states, D=bad["D"],
                                check_values=False, choice=choice))
        assert np.isnan(y[..., 2, 5]).all(), choice
        y[..., 2, 5] = 0.0
        assert np.isfinite(y).all(), choice
        with pytest.raises(ValueError, match="D must be finite.*compute_out"):
            raise_pending_errors()


def test_error_words_are_16_byte_aligned_and_the_ring_wraps():
    """Every word ct.launch is given starts 16-byte aligned (it specializes on the alignment);
    after SLOTS calls the ring reuses its first word, cleared."""
    from kernels.arrays import backend_of as backend_of_arrays
    backend = backend_of_arrays(x=np.zeros(1, np.float32))
    words = [errors.open_word(backend, "test") for _ in range(errors.SLOTS + 1)]
    assert all(w.array.ctypes.data % 16 == 0 and w.array.shape == (1,) for w in words)
    assert words[0].slot == words[-1].slot and words[0].array[0] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gpu", "torch"])
def test_the_default_gpu_call_reads_no_value_on_the_host(backend, monkeypatch):
    def read(*arrays):
        raise AssertionError("a value was read on the host")
    monkeypatch.setattr(contract, "_host_vectors", read)
    ssd_forward(**inputs(backend))
    with pytest.raises(AssertionError, match="read on the host"):
        ssd_forward(**inputs(backend), check_values=True)


@pytest.mark.gpu
def test_the_default_call_captures_in_a_torch_cuda_graph_and_replays_bit_identically():
    """torch.cuda.graph captures the default call (no host read, no synchronisation); replays
    are bit-identical to the eager call; a bad value written into the captured inputs makes the
    replay's outputs NaN and is raised by a later call."""
    import torch
    kw = inputs("torch")
    y_eager = ssd_forward(**kw)  # compiles and allocates the device's error words
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # a warm-up on a side stream, as torch asks before capture
        ssd_forward(**kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ssd_forward(**kw)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, y_eager)
    good_A = kw["A"].clone()
    kw["A"][1] = 0.5  # the captured graph reads this tensor
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(y[:, :, 1]).all() and torch.equal(y[:, :, 0], y_eager[:, :, 0])
    with pytest.raises(ValueError, match="A must be finite and < 0"):
        ssd_forward(**dict(kw, A=good_A))
    assert torch.equal(ssd_forward(**dict(kw, A=good_A)), y_eager)


@pytest.mark.gpu
def test_the_default_call_captures_in_a_cupy_stream_graph():
    import cupy
    kw = inputs("gpu")
    y_eager = ssd_forward(**kw)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        ssd_forward(**kw)  # warm on the capturing stream; its outputs go back to the pool
        stream.begin_capture()
        y = ssd_forward(**kw)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    assert cupy.array_equal(y, y_eager)
    raise_pending_errors()
