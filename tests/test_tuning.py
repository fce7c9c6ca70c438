"""kernels.tuning: compute_out's choices, each correct; a tuned choice overriding the rules; the
search flow (with a stand-in search on the interpreter, the real one on the GPU); the cache file."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

import reference as R
from contract import Dims
from kernels import interpreter, ssd_forward, tuning
from kernels.arrays import backend_of
from kernels.compute_out import (_KERNELS, Choice, compute_out_choices, compute_out_launch,
                                 compute_out_signature, layout_as)
from kernels.ssd_forward import batch_parts_as, forward_launches, forward_parts
from properties.bounds import KAPPA
from properties.checks import forward_bounds
from properties.strategies import Problem
from shapes import Case, check_within, launch_arg, make_inputs, on_backend, step_options

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")

H200_SMS = 132
# float32, chunk 128 of two token blocks, 4 heads of one group, dstate 16: every choice exists
SMALL = Case("tuning_small", 2, 150, 4, 16, 1, 16, 128, D="head")


@pytest.fixture(autouse=True)
def no_tuned_choices(monkeypatch):
    """Each test starts and ends with no tuned choice in the process and no tuning file."""
    monkeypatch.delenv(tuning.ENV, raising=False)
    tuning.forget()
    yield
    tuning.forget()


def stand_ins(dims: Dims, dtype: str, seq_idx: bool = False) -> tuple:
    """compute_out_launch's array arguments as stand-ins (a shape and a dtype, no data)."""
    a = lambda name: SimpleNamespace(shape=dims.shape(name), dtype=dtype)  # noqa: E731
    seg = SimpleNamespace(shape=dims.shape("seq_idx"), dtype="int32") if seq_idx else None
    return (a("x"), a("B"), a("C"), a("dt_out"), a("dA_cumsum"), a("chunk_states"), None, None,
            seg, a("y"))


@pytest.mark.parametrize("dims, dtype, seq_idx, layouts, heads", [
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "float32", False,
                 {"token_blocks", "whole_chunks"}, {1, 2}, id="mamba2_2p7b"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "bfloat16", False, {"token_blocks"},
                 {1, 2}, id="narrow_inputs_token_blocks_only"),
    pytest.param(Dims(1, 512, 8, 64, 1, 64, 256), "float32", True, {"token_blocks"}, {1, 2},
                 id="seq_idx_token_blocks_only"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 64), "float32", False,
                 {"token_blocks", "whole_chunks"}, {1}, id="chunk_of_one_token_block_one_head"),
    pytest.param(Dims(1, 512, 8, 64, 1, 256, 256), "float32", False, {"token_blocks"}, {1, 2},
                 id="dstate_256_no_program_per_chunk"),
    pytest.param(Dims(1, 512, 6, 64, 2, 64, 256), "float32", False,
                 {"token_blocks", "whole_chunks"}, {1}, id="three_heads_per_group_one_head"),
])
def test_compute_out_choices_by_shape(dims, dtype, seq_idx, layouts, heads):
    choices = compute_out_choices(*stand_ins(dims, dtype, seq_idx))
    assert {c.layout for c in choices} == layouts
    assert {c.heads for c in choices} == heads
    assert len(choices) == len(layouts) * len(heads) * 2  # two occupancy hints each
    assert len(set(choices)) == len(choices)


def _stage_inputs(case: Case) -> dict:
    kw = make_inputs(case)
    dt_out, dA_cumsum = (a.astype(np.float32) for a in
                         R.chunk_cumsum_ref(kw["dt"], kw["A"], case.chunk_size, **step_options(kw)))
    chunk_states, _ = R.fwd_pass_state_ref(kw["x"], kw["B"], dt_out, dA_cumsum)
    return dict(x=kw["x"], B=kw["B"], C=kw["C"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                chunk_states=chunk_states.astype(np.float32), D=kw.get("D"), z=None, seq_idx=None)


def test_every_choice_matches_the_reference(request):
    """What a search may pick is correct: each of the small shape's eight choices, run on the
    interpreter, is within compute_out's bound of the float64 reference."""
    inputs = _stage_inputs(SMALL)
    y_ref = R.compute_out_ref(**inputs)
    M = R.compute_out_magnitude(**inputs)
    arrays = tuple(inputs[n] for n in ("x", "B", "C", "dt_out", "dA_cumsum", "chunk_states", "D",
                                       "z"))
    choices = compute_out_choices(*arrays, None, np.empty_like(inputs["x"]))
    assert len(choices) == 8
    for choice in choices:
        y = np.full_like(inputs["x"], np.nan)
        kernel, grid, args = compute_out_launch(*arrays, None, y, H200_SMS, choice=choice)
        assert kernel is _KERNELS[choice.layout, False, choice.occupancy]
        assert launch_arg(kernel, args, "HEADS") == choice.heads
        interpreter.launch(grid, kernel, args)
        check_within("y", y, y_ref, M, KAPPA, f"{request.node.name}[{choice}]")


def test_a_tuned_choice_overrides_the_rules_but_not_layout_as():
    arrays = stand_ins(Dims(4, 4096, 80, 64, 1, 128, 256), "float32")
    rules = compute_out_launch(*arrays, H200_SMS)
    assert launch_arg(rules[0], rules[2], "HEADS") == 2  # the rules: two heads per program
    tuned = {compute_out_signature(*arrays): Choice("token_blocks", 1, 1)}
    kernel, grid, args = compute_out_launch(*arrays, H200_SMS, tuned)
    assert kernel is _KERNELS["token_blocks", False, 1]
    assert launch_arg(kernel, args, "HEADS") == 1 and grid[1] == 80
    other = {compute_out_signature(*stand_ins(Dims(4, 4096, 80, 64, 1, 128, 128),
                                              "float32")): Choice("token_blocks", 1, 1)}
    assert compute_out_launch(*arrays, H200_SMS, other)[0] is rules[0]  # another shape's
    with layout_as("whole_chunks"):
        assert compute_out_launch(*arrays, H200_SMS, tuned)[0] is _KERNELS["whole_chunks",
                                                                            False, 2]


def test_a_choice_that_cannot_run_is_refused():
    arrays = stand_ins(Dims(1, 512, 8, 64, 1, 64, 256), "float32", seq_idx=True)
    with pytest.raises(ValueError, match="choice: .* cannot run here"):
        compute_out_launch(*arrays, H200_SMS, choice=Choice("whole_chunks", 1, 2))


def test_tune_parts_searches_each_signature_once_and_ssd_forward_takes_it(request):
    """The search flow on the interpreter with a stand-in search: compute_out's inputs are
    computed before it searches (finite), two batch slices of one signature are searched once,
    the pick is recorded for the device, and the forward then launches it and stays correct."""
    kw = make_inputs(SMALL)
    backend = backend_of(x=kw["x"])
    dims = Dims(SMALL.batch, SMALL.seqlen, SMALL.nheads, SMALL.headdim, SMALL.ngroups,
                SMALL.dstate, SMALL.chunk_size)
    outputs = {n: np.full(dims.shape(n), np.nan, np.float32)
               for n in ("dt_out", "dA_cumsum", "chunk_states", "final_states", "y")}
    parts = forward_parts(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["D"], None, None,
                          None, None, False, (0.0, np.inf), *outputs.values(), 1, 2)
    searched = []

    def search(stream, launch_of, choices):
        pick = choices[-1]  # whole chunks, two heads, occupancy 2: not the interpreter's rule
        kernel, grid, args = launch_of(pick)
        assert np.isfinite(args[4]).all() and np.isfinite(args[5]).all()  # dA_cumsum, states
        searched.append(choices)
        return SimpleNamespace(best=SimpleNamespace(config=pick))

    results = tuning.tune_parts(backend, "test device", parts, search)
    assert len(searched) == 1 and len(results) == 1  # two slices, one signature
    (signature,) = results
    table = tuning._table("test device")
    assert table == {signature: Choice("whole_chunks", 2, 2)}
    part = forward_parts(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["D"], None, None, None,
                         None, False, (0.0, np.inf), *outputs.values(), 1, 2)[0]
    assert forward_launches(**part)[-1][0] is not _KERNELS["whole_chunks", False, 2]
    assert forward_launches(**part, tuned=table)[-1][0] is _KERNELS["whole_chunks", False, 2]


def test_tuning_file_round_trip(tmp_path, monkeypatch):
    path = tmp_path / "tuning" / "choices.json"
    monkeypatch.setenv(tuning.ENV, str(path))
    signature = ("float32", 4, 4096, 80, 64, 1, 128, 256, True, False, False, False, False)
    tuning.record("device A", signature, Choice("token_blocks", 1, 1))
    assert path.exists()
    tuning.forget()
    assert tuning._table("device A") == {signature: Choice("token_blocks", 1, 1)}
    assert tuning._table("device B") == {}  # another device, or another cuda-tile version
    path.write_text('{"tables": {"device A": [{"signature": [1]}]}}')
    tuning.forget()
    with pytest.raises(ValueError, match=r"\$CUTILE_SSD_TUNING: .* is not a tuning file"):
        tuning._table("device A")


def test_the_interpreter_has_no_tuned_choices():
    assert tuning.table(backend_of(x=np.zeros(1, np.float32))) is None


def test_tune_forward_needs_gpu_arrays():
    kw = make_inputs(SMALL)
    with pytest.raises(TypeError, match="x: tune_forward times kernels on the GPU"):
        tuning.tune_forward(**kw)


@pytest.mark.gpu
def test_tune_forward_on_the_gpu_then_ssd_forward_takes_the_choice(request):
    """cuda.tile.tune's search on the GPU: the best of the small shape's choices is recorded for
    this device, and ssd_forward then launches it and matches the float64 reference."""
    from shapes import recorded_launches
    kw = make_inputs(SMALL)
    gpu = on_backend("gpu", kw)
    with batch_parts_as(1):
        results = tuning.tune_forward(**gpu)
        (signature, result), = results.items()
        assert result.best.config in compute_out_choices(*stand_ins(
            Dims(SMALL.batch, SMALL.seqlen, SMALL.nheads, SMALL.headdim, SMALL.ngroups,
                 SMALL.dstate, SMALL.chunk_size), "float32"))
        table = tuning.table(backend_of(x=gpu["x"]))
        assert table[signature] == result.best.config
        with recorded_launches() as launches:
            y = ssd_forward(**gpu)
    kernel, args = launches[-1][1], launches[-1][2]
    assert kernel is _KERNELS[result.best.config.layout, False, result.best.config.occupancy]
    assert launch_arg(kernel, args, "HEADS") == result.best.config.heads
    y_ref, _ = R.ssd_chunked(**kw)
    b = forward_bounds(Problem(**kw))
    check_within("y", y, y_ref, b.M, b.kappa_y, request.node.name, b.extra_y)


def test_tuning_file_holds_json(tmp_path, monkeypatch):
    """The file is plain JSON a person can read: device key -> [{signature, choice}]."""
    path = tmp_path / "choices.json"
    monkeypatch.setenv(tuning.ENV, str(path))
    tuning.record("device A", ("float32", 1), Choice("whole_chunks", 2, 1))
    assert json.loads(path.read_text()) == {"tables": {"device A": [
        {"signature": ["float32", 1], "choice": ["whole_chunks", 2, 1]}]}}
