"""kernels.tuning: compute_out's choices, each correct; a tuned choice overriding the rules; the
search flow (with a stand-in search on the interpreter, the real one on the GPU); the cache file."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

import reference as R
from contract import Dims
from kernels import compute_out, interpreter, ssd_forward, tuning, tuning_table
from kernels.arrays import Backend, backend_of
from kernels.compute_out import (_KERNELS, Choice, compute_out_choices,
                                 compute_out_launch, compute_out_signature)
from kernels.launches import ForwardArrays, forward_launches, forward_parts
from properties.bounds import KAPPA
from properties.compare import forward_bounds
from properties.strategies import Problem
from shapes import Case, check_within, launch_arg, make_inputs, on_backend, step_options

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")

H200_SMS = 132
# float32, chunk 128 of two token blocks, 4 heads of one group, dstate 16: every choice exists
SMALL = Case("tuning_small", 2, 150, 4, 16, 1, 16, 128, D="head")


@pytest.fixture
def h200_interpreter(monkeypatch):
    """The interpreter sizes its grids as for the H200's SMs (it has one), so that SMALL's
    forward runs the three kernels, as on the GPU, not the scan; no launch plan of another SM
    count is kept."""
    import importlib
    plan_module = importlib.import_module("kernels.plan")
    monkeypatch.setattr(Backend, "sm_count", property(lambda self: H200_SMS))
    monkeypatch.setattr(plan_module, "_PLANS", {})


@pytest.fixture(autouse=True)
def no_tuned_choices(monkeypatch):
    """Each test starts and ends with no tuned choice in the process and no tuning file."""
    monkeypatch.delenv(tuning_table.ENV, raising=False)
    tuning_table.forget()
    yield
    tuning_table.forget()


def stand_ins(dims: Dims, dtype: str, seq_idx: bool = False) -> tuple:
    """compute_out_launch's array arguments as stand-ins (a shape and a dtype, no data)."""
    a = lambda name: SimpleNamespace(shape=dims.shape(name), dtype=dtype)
    seg = SimpleNamespace(shape=dims.shape("seq_idx"), dtype="int32") if seq_idx else None
    return (a("x"), a("B"), a("C"), a("dt_out"), a("dA_cumsum"), a("chunk_states"), None, None,
            seg, a("y"))


@pytest.mark.parametrize("dims, dtype, seq_idx, layouts, heads, block_ts, count", [
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "float32", False,
                 {"token_blocks", "whole_chunks"}, {1, 2}, {32, 64, 128}, 16, id="mamba2_2p7b"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "bfloat16", False, {"token_blocks"},
                 {1, 2}, {32, 64, 128}, 12, id="narrow_inputs_token_blocks_only"),
    pytest.param(Dims(1, 512, 8, 64, 1, 64, 256), "float32", True, {"token_blocks"}, {1, 2},
                 {32, 64, 128}, 12, id="seq_idx_token_blocks_only"),
    # block_t 128 clamps to the chunk's 64 tokens, the extent of block_t 64: left out; two heads
    # only with the chunk's two blocks of 32
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 64), "float32", False,
                 {"token_blocks", "whole_chunks"}, {1, 2}, {32, 64}, 8,
                 id="chunk_of_one_token_block_one_head"),
    pytest.param(Dims(1, 512, 8, 64, 1, 256, 256), "float32", False, {"token_blocks"}, {1, 2},
                 {32, 64, 128}, 12, id="dstate_256_no_program_per_chunk"),
    pytest.param(Dims(1, 512, 6, 64, 2, 64, 256), "float32", False,
                 {"token_blocks", "whole_chunks"}, {1}, {32, 64, 128}, 8,
                 id="three_heads_per_group_one_head"),
])
def test_compute_out_choices_by_shape(dims, dtype, seq_idx, layouts, heads, block_ts, count):
    arrays = stand_ins(dims, dtype, seq_idx)
    choices = compute_out_choices(*arrays)
    assert {c.layout for c in choices} == layouts
    assert {c.heads for c in choices} == heads
    assert {c.block_t for c in choices} == block_ts
    assert len(choices) == count and len(set(choices)) == count
    # each is a distinct launch; a chunk of one token block takes one head
    launches = set()
    for c in choices:
        kernel, grid, args = compute_out_launch(*arrays, H200_SMS, choice=c)
        block_t = launch_arg(kernel, args, "BLOCK_T")
        launches.add((c.layout, c.heads, c.occupancy, block_t))
        assert c.heads == 1 or block_t < dims.chunk_size
    assert len(launches) == count


def _stage_inputs(case: Case) -> dict:
    kw = make_inputs(case)
    dt_out, dA_cumsum = (a.astype(np.float32) for a in
                         R.chunk_cumsum_ref(kw["dt"], kw["A"], case.chunk_size, **step_options(kw)))
    chunk_states, _ = R.fwd_pass_state_ref(kw["x"], kw["B"], dt_out, dA_cumsum)
    return dict(x=kw["x"], B=kw["B"], C=kw["C"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                chunk_states=chunk_states.astype(np.float32), D=kw.get("D"), z=None, seq_idx=None)


def test_every_choice_matches_the_reference(request):
    """What a search may pick is correct: each of the small shape's fourteen choices, run on the
    interpreter, is within compute_out's bound of the float64 reference."""
    inputs = _stage_inputs(SMALL)
    y_ref = R.compute_out_ref(**inputs)
    M = R.compute_out_magnitude(**inputs)
    arrays = tuple(inputs[n] for n in ("x", "B", "C", "dt_out", "dA_cumsum", "chunk_states", "D",
                                       "z"))
    choices = compute_out_choices(*arrays, None, np.empty_like(inputs["x"]))
    # token blocks of 64 and 32: 2 heads x 2 hints each; of 128: one head; a program per chunk
    # (at 64): 2 x 2
    assert len(choices) == 14
    for choice in choices:
        y = np.full_like(inputs["x"], np.nan)
        kernel, grid, args = compute_out_launch(*arrays, None, y, H200_SMS, choice=choice,
                                                errors=np.zeros(1, np.int32))
        assert kernel is _KERNELS[choice.layout, False, choice.occupancy]
        assert launch_arg(kernel, args, "HEADS") == choice.heads
        interpreter.launch(grid, kernel, args)
        check_within("y", y, y_ref, M, KAPPA, f"{request.node.name}[{choice}]")


def test_a_tuned_choice_overrides_the_rules_and_a_given_one_overrides_both():
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
    given = Choice("whole_chunks", 2, 2)
    assert compute_out_launch(*arrays, H200_SMS, tuned, given)[0] is _KERNELS["whole_chunks",
                                                                                False, 2]


def test_a_choice_tuned_with_one_chunk_state_dtype_is_not_used_with_the_other():
    """bfloat16 inputs keep their chunk states in float32 or bfloat16 (state_dtype): a search
    times one of them, so its choice is keyed by the states' dtype too."""
    narrow = stand_ins(Dims(4, 4096, 80, 64, 1, 128, 256), "bfloat16")  # bfloat16 states
    wide = (*narrow[:5], SimpleNamespace(shape=narrow[5].shape, dtype="float32"), *narrow[6:])
    rules = compute_out_launch(*narrow, H200_SMS)
    assert launch_arg(rules[0], rules[2], "HEADS") == 1  # the rules: one head per program
    tuned = {compute_out_signature(*wide): Choice("token_blocks", 2, 1)}
    assert launch_arg(*compute_out_launch(*wide, H200_SMS, tuned)[::2], "HEADS") == 2
    kernel, _, args = compute_out_launch(*narrow, H200_SMS, tuned)
    assert kernel is rules[0] and launch_arg(kernel, args, "HEADS") == 1


@pytest.mark.parametrize("choice", [
    Choice("whole_chunks", 1, 2),  # seq_idx: token blocks only
    Choice("token_blocks", 4, 2),  # 4 heads would span two groups of 2
    Choice("token_blocks", 3, 2),  # not a power of two
    Choice("token_blocks", 1, 3),  # no such occupancy hint
    Choice("token_blocks", 1, 2, 48),  # no such token block
], ids=["whole_chunks_with_seq_idx", "heads_across_groups", "three_heads", "occupancy_3",
        "block_t_48"])
def test_a_choice_that_cannot_run_is_refused(choice):
    """Given or tuned (from a file of another version, say): never launched silently wrong."""
    arrays = stand_ins(Dims(1, 512, 8, 64, 4, 64, 256), "float32", seq_idx=True)
    with pytest.raises(ValueError, match=r"^choice: .* is not one that compute_out can run"):
        compute_out_launch(*arrays, H200_SMS, choice=choice)
    tuned = {compute_out_signature(*arrays): choice}
    with pytest.raises(ValueError, match=r"^tuned choice: .* is not one that compute_out can"):
        compute_out_launch(*arrays, H200_SMS, tuned)


def test_compute_out_launches_a_given_choice_and_refuses_one_it_cannot_run(request):
    """compute_out(choice=...) (the property suite runs every choice through it): the given
    choice is the one launched and matches the reference; one the shape cannot run raises
    before any launch."""
    from shapes import recorded_launches
    inputs = _stage_inputs(SMALL)
    y_ref = R.compute_out_ref(**inputs)
    M = R.compute_out_magnitude(**inputs)
    choice = Choice("whole_chunks", 2, 1)  # not the rules' on this shape
    with recorded_launches() as launches:
        y = compute_out(**inputs, choice=choice)
    (_, kernel, args), = launches
    assert kernel is _KERNELS["whole_chunks", False, 1] and launch_arg(kernel, args, "HEADS") == 2
    check_within("y", y, y_ref, M, KAPPA, request.node.name)
    with recorded_launches() as launches, pytest.raises(ValueError, match=r"^choice: "):
        compute_out(**inputs, choice=Choice("token_blocks", 4, 2))  # more heads than HEADS
    assert not launches


def _parts(kw: dict, parts: int, sm_count: int = H200_SMS) -> list:
    """ssd_forward's forward_parts for make_inputs' `kw` (D, no other option) in `parts` slices
    on a device of `sm_count` SMs, outputs NaN-filled."""
    dims = Dims(SMALL.batch, SMALL.seqlen, SMALL.nheads, SMALL.headdim, SMALL.ngroups,
                SMALL.dstate, SMALL.chunk_size)
    outputs = [np.full(dims.shape(n), np.nan, np.float32)
               for n in ("dt_out", "dA_cumsum", "chunk_states", "final_states", "y")]
    arrays = ForwardArrays(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["D"], None, None,
                           None, None, False, (0.0, np.inf), *outputs)
    return forward_parts(arrays, sm_count, parts)


def test_tune_parts_searches_each_signature_once_and_ssd_forward_takes_it(request,
                                                                           h200_interpreter):
    """The search flow on the interpreter with a stand-in search: compute_out's inputs are
    computed before it searches (finite), two batch slices of one signature are searched once,
    the pick is recorded for the device, and the forward's launches then take it (the wiring
    test below runs such a forward)."""
    kw = make_inputs(SMALL)
    backend = backend_of(x=kw["x"])
    parts = _parts(kw, 2)
    searched = []
    pick = Choice("whole_chunks", 2, 2)  # not the interpreter's rule

    def search(stream, launch_of, choices):
        assert pick in choices
        kernel, grid, args = launch_of(pick)
        assert np.isfinite(args[4]).all() and np.isfinite(args[5]).all()  # dA_cumsum, states
        searched.append(choices)
        return SimpleNamespace(best=SimpleNamespace(config=pick))

    results = tuning.tune_parts(backend, "test device", parts, search)
    assert len(searched) == 1 and len(results) == 1  # two slices, one signature
    (signature,) = results
    table = tuning_table._table("test device")
    assert table == {signature: pick}
    part = _parts(kw, 2)[0]
    assert forward_launches(*part)[-1][0] is not _KERNELS["whole_chunks", False, 2]
    assert forward_launches(*part, tuned=table)[-1][0] is _KERNELS["whole_chunks", False, 2]


def test_tune_parts_searches_nothing_where_the_forward_runs_the_scan():
    """On one SM SMALL's forward is the scan: no compute_out is launched, none is searched, and
    nothing but chunk_cumsum's and the scan's launches is made."""
    kw = make_inputs(SMALL)
    (part,) = _parts(kw, 1, sm_count=1)
    names = [k._pyfunc.__name__ for k, _, _ in forward_launches(*part)]
    assert names == ["_chunk_cumsum_kernel", "_ssd_scan_kernel"]

    def search(stream, launch_of, choices):
        raise AssertionError("searched a compute_out the forward does not launch")

    assert tuning.tune_parts(backend_of(x=kw["x"]), "test device", [part], search) == {}
    assert tuning_table._table("test device") == {}


def test_tuning_file_round_trip(tmp_path, monkeypatch):
    path = tmp_path / "tuning" / "choices.json"
    monkeypatch.setenv(tuning_table.ENV, str(path))
    signature = ("float32", 4, 4096, 80, 64, 1, 128, 256, True, False, False, False, False)
    tuning_table.record("device A", signature, Choice("token_blocks", 1, 1))
    assert path.exists()
    tuning_table.forget()
    assert tuning_table._table("device A") == {signature: Choice("token_blocks", 1, 1)}
    assert tuning_table._table("device B") == {}  # another device, or another cuda-tile version
    path.write_text('{"tables": {"device A": [{"signature": [1]}]}}')
    tuning_table.forget()
    with pytest.raises(ValueError, match=r"\$CUTILE_SSD_TUNING: .* is not a tuning file"):
        tuning_table._table("device A")


def test_the_interpreter_has_no_tuned_choices():
    assert tuning_table.table(backend_of(x=np.zeros(1, np.float32))) is None


def test_tune_forward_needs_gpu_arrays():
    kw = make_inputs(SMALL)
    with pytest.raises(TypeError, match="x: tune_forward times kernels on the GPU"):
        tuning.tune_forward(**kw)


RULES = Choice("token_blocks", 2, 2)  # what the rules run for SMALL (any SM count)
OTHER = Choice("whole_chunks", 1, 1)  # a choice they never make for it


def _small_reference(kw: dict):
    y_ref, _ = R.ssd_chunked(**kw)
    return y_ref, forward_bounds(Problem(**kw))


def test_ssd_forward_and_compute_out_launch_the_tuned_choice(monkeypatch, request,
                                                            h200_interpreter):
    """The wiring: with a tuned choice in the device's table (the interpreter made to have one),
    ssd_forward and compute_out launch it instead of the rules', and y stays within bounds."""
    from shapes import recorded_launches
    kw = make_inputs(SMALL)
    with recorded_launches() as launches:
        ssd_forward(**kw)
    assert launch_arg(launches[-1][1], launches[-1][2], "HEADS") == RULES.heads
    tables = {}
    monkeypatch.setattr(tuning_table, "table", lambda backend: tables)
    for parts in (1, 2):  # the whole batch's signature, and its slices'
        for part in _parts(kw, parts):
            tables[compute_out_signature(*part.arrays.compute_out_arrays())] = OTHER
    inputs = _stage_inputs(SMALL)
    y_ref, b = _small_reference(kw)
    for parts in (1, 2):
        with recorded_launches() as launches:
            y = ssd_forward(**kw, batch_parts=parts)
        assert [n for n, _, _ in launches].count("_compute_out_chunk_kernel") == parts
        assert all(k is _KERNELS[OTHER.layout, False, OTHER.occupancy] for n, k, _ in launches
                   if n == "_compute_out_chunk_kernel")
        check_within("y", y, y_ref, b.M, b.kappa_y, f"{request.node.name}[{parts}]", b.extra_y)
    with recorded_launches() as launches:
        y = compute_out(**{k: v for k, v in inputs.items()})
    assert [n for n, _, _ in launches] == ["_compute_out_chunk_kernel"]
    check_within("y", y, R.compute_out_ref(**inputs), R.compute_out_magnitude(**inputs), KAPPA,
                 request.node.name)


def test_search_hands_exhaustive_search_grid_kernel_and_args(monkeypatch):
    """tuning.search through a stand-in exhaustive_search that launches each choice as the real
    one would (its grid, kernel and args functions) on the interpreter: every choice runs and
    writes every element of y; the fastest stand-in time wins."""
    import cuda.tile.tune
    inputs = _stage_inputs(SMALL)
    arrays = tuple(inputs[n] for n in ("x", "B", "C", "dt_out", "dA_cumsum", "chunk_states", "D",
                                       "z"))
    y = np.full_like(inputs["x"], np.nan)
    ran = []

    def exhaustive_search(space, stream, grid_fn, kernel, args_fn, hints_fn=None, **options):
        assert options == {"quiet": True} and hints_fn is None
        for c in space:
            y[...] = np.nan
            interpreter.launch(grid_fn(c), kernel(c), args_fn(c))
            assert not np.isnan(y).any(), c
            ran.append(c)
        return SimpleNamespace(best=SimpleNamespace(config=space[len(space) // 2]))

    monkeypatch.setattr(cuda.tile.tune, "exhaustive_search", exhaustive_search)
    choices = compute_out_choices(*arrays, None, y)
    word = np.zeros(1, np.int32)  # an error word (kernels.errors)
    result = tuning.search(None, lambda c: compute_out_launch(*arrays, None, y, 1, choice=c,
                                                              errors=word), choices)
    assert ran == choices and result.best.config == choices[len(choices) // 2]


def test_device_key_holds_the_device_and_the_cuda_tile_version(monkeypatch):
    monkeypatch.setattr(tuning_table, "_device_name", lambda kind, device: f"GPU {device}")
    key = tuning_table.device_key("cupy", 1, 132)
    assert key.startswith("GPU 1 | 132 SMs | cuda-tile ")
    gpu = SimpleNamespace(kind="cupy", device=1, sm_count=132)
    tuning_table.record(key, ("float32", 1), Choice("token_blocks", 1, 1))
    assert tuning_table.table(gpu) == {("float32", 1): Choice("token_blocks", 1, 1)}
    monkeypatch.setattr(tuning_table.ct, "__version__", "0.0.0")
    assert tuning_table.device_key("cupy", 1, 132) != key
    assert tuning_table.table(gpu) == {}  # another cuda-tile version: nothing tuned


def test_tuning_file_is_read_once_and_a_bad_one_fails_each_time(tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    monkeypatch.setenv(tuning_table.ENV, str(path))
    tuning_table.record("device A", ("float32", 1), Choice("token_blocks", 1, 1))
    tuning_table.forget()
    reads = []
    read = tuning_table._read
    monkeypatch.setattr(tuning_table, "_read", lambda p: reads.append(p) or read(p))
    for _ in range(3):
        assert tuning_table._table("device A") == {("float32", 1): Choice("token_blocks", 1, 1)}
    assert len(reads) == 1
    path.write_text("{")
    tuning_table.forget()
    for _ in range(2):
        with pytest.raises(ValueError, match="is not a tuning file"):
            tuning_table._table("device A")


def test_tuning_file_keeps_what_another_process_wrote(tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    monkeypatch.setenv(tuning_table.ENV, str(path))
    tuning_table.record("device A", ("float32", 1), Choice("token_blocks", 1, 1))
    tuning_table.forget()  # another process: it read the file before the first one wrote again
    tuning_table._table("device A")
    path.write_text(json.dumps({"format": tuning_table.FORMAT, "tables": {"device B": [
        {"signature": ["float32", 2], "choice": ["whole_chunks", 2, 2, 64]}]}}))
    tuning_table.record("device A", ("float32", 3), Choice("token_blocks", 2, 1))
    tuning_table.forget()
    assert tuning_table._table("device B") == {("float32", 2): Choice("whole_chunks", 2, 2)}
    assert tuning_table._table("device A") == {("float32", 1): Choice("token_blocks", 1, 1),
                                         ("float32", 3): Choice("token_blocks", 2, 1)}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gpu", "torch"])
def test_tune_forward_on_the_gpu_then_ssd_forward_takes_the_choice(kind, request):
    """cuda.tile.tune's search on the GPU (CuPy arrays, or torch tensors on torch's stream): the
    best of the small shape's fourteen choices is recorded for this device; ssd_forward then
    launches a recorded choice (the best, then one the rules never make) and matches the
    float64 reference."""
    from shapes import recorded_launches
    if kind == "torch":
        pytest.importorskip("torch")
    kw = make_inputs(SMALL)
    gpu = on_backend(kind, kw)
    y_ref, b = _small_reference(kw)
    results = tuning.tune_forward(**gpu)  # SMALL's batch of 2 runs whole on the GPU
    (signature, result), = results.items()
    choices = compute_out_choices(*stand_ins(
        Dims(SMALL.batch, SMALL.seqlen, SMALL.nheads, SMALL.headdim, SMALL.ngroups,
             SMALL.dstate, SMALL.chunk_size), "float32"))
    assert len(result.successes) == len(choices) and not result.failures
    backend = backend_of(x=gpu["x"])
    assert tuning_table.table(backend) == {signature: tuple(result.best.config)}
    for choice in (result.best.config, OTHER):
        # recorded as a search records it: ssd_forward's kept plans are rebuilt after it
        tuning_table.record(tuning_table.device_key(backend.kind, backend.device,
                                                    backend.sm_count), signature, choice)
        with recorded_launches() as launches:
            y = ssd_forward(**gpu, batch_parts=1)
        kernel, args = launches[-1][1], launches[-1][2]
        assert kernel is _KERNELS[choice.layout, False, choice.occupancy]
        assert launch_arg(kernel, args, "HEADS") == choice.heads
        assert launch_arg(kernel, args, "BLOCK_T") == min(choice.block_t, SMALL.chunk_size)
        check_within("y", y, y_ref, b.M, b.kappa_y, f"{request.node.name}[{choice}]",
                     b.extra_y)


def test_tuning_file_holds_json(tmp_path, monkeypatch):
    """The file is plain JSON a person can read: device key -> [{signature, choice}]."""
    path = tmp_path / "choices.json"
    monkeypatch.setenv(tuning_table.ENV, str(path))
    tuning_table.record("device A", ("float32", 1), Choice("whole_chunks", 2, 1))
    assert json.loads(path.read_text()) == {"format": tuning_table.FORMAT, "tables": {
        "device A": [{"signature": ["float32", 1], "choice": ["whole_chunks", 2, 1, 64]}]}}
