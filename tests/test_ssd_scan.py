"""ssd_scan against its float64 reference on the table of shapes, on both backends, in every
choice the shape allows; its launch and its refusals."""

import numpy as np
import pytest

import reference as R
from contract import Dims
from kernels.arrays import Backend, LaunchDims
from kernels.interpreter import launch
from kernels import ssd_scan
from kernels.ssd_scan import (CHOICES, FEW_PROGRAMS_CHOICE, RULES_CHOICE, Choice, rules_choice,
                              scan_runs, scan_scratch, ssd_scan_choices, ssd_scan_launches)
from properties.bounds import KAPPA
from shapes import (BACKENDS, CASES, check_within, launch_arg, make_inputs, on_backend,
                    recorded_launches, step_options)

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")

H200_SMS = 132


def _stage_inputs(case) -> tuple[dict, dict]:
    """(ssd_scan's keyword arguments: fp32-exact dt_out and dA_cumsum of the reference, the
    case's options; make_inputs' arguments)."""
    kw = make_inputs(case)
    dt_out, dA_cumsum = (a.astype(np.float32) for a in
                         R.chunk_cumsum_ref(kw["dt"], kw["A"], case.chunk_size, **step_options(kw)))
    return dict(x=kw["x"], B=kw["B"], C=kw["C"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                D=kw.get("D"), z=kw.get("z"), initial_states=kw.get("initial_states"),
                seq_idx=kw.get("seq_idx")), kw


def _reference(inputs: dict) -> tuple:
    """(y, final_states) of the float64 reference, and the magnitudes their bounds scale by."""
    y_ref, final_ref = R.ssd_scan_ref(**inputs)
    upstream = (inputs["x"], inputs["B"], inputs["dt_out"], inputs["dA_cumsum"])
    states_M, final_M = R.fwd_pass_state_magnitude(*upstream, inputs["initial_states"],
                                                   inputs["seq_idx"])
    M = R.compute_out_magnitude(*upstream[:2], inputs["C"], *upstream[2:], states_M,
                                inputs["D"], inputs["z"], inputs["seq_idx"])
    return y_ref, final_ref, M, final_M


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_ssd_scan_matches_reference(case, backend, request):
    """Every choice the case's shape allows (heads per program x headdim block x occupancy x
    worker warps x segments; on the interpreter, which reads no hint, the first choice of each
    heads x headdim block x segments): y and final_states within the forward's kappa of the
    float64 reference of the same inputs (accumulation_length counts the scan's token-block
    boundaries)."""
    inputs, _ = _stage_inputs(case)
    y_ref, final_ref, M, final_M = _reference(inputs)
    choices = ssd_scan_choices(inputs["x"], inputs["B"])
    assert RULES_CHOICE in choices
    if backend == "interpreter":
        choices = list({(c.heads, c.block_p, c.segments): c
                        for c in reversed(choices)}.values())
    for choice in choices:
        with recorded_launches() as launches:
            y, final = ssd_scan(**on_backend(backend, inputs), choice=choice)
        assert [name for name, _, _ in launches] == ["_ssd_scan_kernel"]
        assert launch_arg(launches[0][1], launches[0][2], "HEADS") == choice.heads
        test_id = f"{request.node.name}[{choice}]"
        check_within("y", y, y_ref, M, KAPPA, test_id)
        check_within("final_states", final, final_ref, final_M, KAPPA, test_id)


def test_two_heads_only_where_they_share_a_group():
    """A choice of two heads per program is refused, before any launch, where a group has one
    head (its two heads would read two groups)."""
    inputs, _ = _stage_inputs(CASES[[c.id for c in CASES].index("ngroups_eq_nheads")])
    two = next(c for c in CHOICES if c.heads == 2)
    assert two not in ssd_scan_choices(inputs["x"], inputs["B"])
    with recorded_launches() as launches, pytest.raises(ValueError, match="^choice: "):
        ssd_scan(**inputs, choice=two)
    assert not launches


@pytest.mark.parametrize("dims, dtype, runs", [
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "float32", True, id="mamba2_2p7b"),
    pytest.param(Dims(8, 2048, 24, 64, 1, 128, 256), "float32", True, id="mamba2_130m"),
    # 80 programs on 132 SMs: the scan in bfloat16 and float16 (0.4 of a wave or more), the
    # three kernels in float32, which takes the scan from 93 programs (0.7 of a wave)
    pytest.param(Dims(1, 16384, 80, 64, 1, 128, 256), "bfloat16", True, id="long_seq_bf16"),
    pytest.param(Dims(1, 16384, 80, 64, 1, 128, 256), "float16", True, id="long_seq_fp16"),
    pytest.param(Dims(1, 16384, 80, 64, 1, 128, 256), "float32", False, id="long_seq_fp32"),
    pytest.param(Dims(1, 16384, 93, 64, 1, 128, 256), "float32", True, id="93_programs_fp32"),
    pytest.param(Dims(1, 16384, 92, 64, 1, 128, 256), "float32", False, id="92_programs_fp32"),
    pytest.param(Dims(1, 16384, 52, 64, 1, 128, 256), "float16", False, id="52_programs_fp16"),
    pytest.param(Dims(2, 4000, 64, 64, 8, 64, 128), "float32", True, id="groups_8_layer_fp32"),
    pytest.param(Dims(1, 16384, 53, 64, 1, 128, 256), "bfloat16", True, id="53_programs_bf16"),
    pytest.param(Dims(1, 16384, 52, 64, 1, 128, 256), "bfloat16", False, id="52_programs_bf16"),
    pytest.param(Dims(1, 4096, 24, 64, 1, 128, 256), "bfloat16", False, id="24_programs_bf16"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 256, 256), "float32", False, id="dstate_256"),
    pytest.param(Dims(1, 2**24, 128, 64, 1, 128, 256), "float32", False, id="int64"),
])
def test_the_forward_takes_the_scan_where_its_grid_fills_the_gpu(dims, dtype, runs):
    from types import SimpleNamespace
    a = lambda name: SimpleNamespace(shape=dims.shape(name), dtype=dtype)
    arrays = (a("x"), a("B"), a("C"), a("dt_out"), a("dA_cumsum"), a("y"))
    assert scan_runs(a("x"), a("B"), a("dt_out"), arrays, H200_SMS) == runs


@pytest.mark.parametrize("dims, dtype, few", [
    pytest.param(Dims(1, 16384, 80, 64, 1, 128, 256), "bfloat16", True, id="long_seq_bf16"),
    pytest.param(Dims(1, 16384, 132, 64, 1, 128, 256), "bfloat16", True, id="one_wave_bf16"),
    pytest.param(Dims(1, 16384, 133, 64, 1, 128, 256), "bfloat16", False, id="wave_plus_1_bf16"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "bfloat16", False, id="mamba2_2p7b_bf16"),
    pytest.param(Dims(1, 16384, 80, 64, 1, 128, 256), "float32", False, id="long_seq_fp32"),
    pytest.param(Dims(1, 16384, 80, 64, 1, 128, 256), "float16", True, id="long_seq_fp16"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "float16", False, id="mamba2_2p7b_fp16"),
])
def test_a_16_bit_grid_of_one_program_per_sm_or_fewer_runs_eight_worker_warps(dims, dtype, few):
    expected = FEW_PROGRAMS_CHOICE if few else RULES_CHOICE
    assert rules_choice(LaunchDims(dims, dtype), H200_SMS) == expected


@pytest.mark.parametrize("case_id", ["seq_idx_arbitrary", "all_options_chunk16",
                                     "chunk64_ragged", "seqlen_below_chunk"])
def test_segments_hand_their_states_on_and_leave_every_flag_zero(case_id):
    """The segmented kernel in four segments, where the sequence has more chunks, as many or
    fewer (an empty segment hands its entering state on): y and final_states within kappa of the
    reference, as the scan without segments, on the interpreter, which runs each waiting program
    again once its predecessor's flag is set and refuses a read of a handed-on state that no
    acquire ordered; every flag a segment set is consumed."""
    case = CASES[[c.id for c in CASES].index(case_id)]
    inputs, _ = _stage_inputs(case)
    y_ref, final_ref, M, final_M = _reference(inputs)
    segments = 4
    choice = Choice(1, 1, 64, None, segments)
    shapes = scan_scratch(inputs["x"], inputs["B"], choice)
    y = np.full(inputs["x"].shape, np.nan, np.float32)
    final = np.full(final_ref.shape, np.nan, np.float32)
    passed = np.full(shapes["passed"], np.nan, np.float32)
    ready = np.zeros(shapes["ready"], np.int32)
    errors = np.zeros(1, np.int32)
    seg = Backend.of("numpy").segment_ids(inputs["seq_idx"])
    for kernel, grid, args in ssd_scan_launches(
            inputs["x"], inputs["B"], inputs["C"], inputs["dt_out"], inputs["dA_cumsum"],
            inputs["initial_states"], inputs["D"], inputs["z"], seg, y, final, 1, choice,
            errors=errors, passed=passed, ready=ready):
        assert grid[0] == segments * -(-inputs["x"].shape[3] // 64)
        launch(grid, kernel, args)
    test_id = f"{case_id}[{segments} segments]"
    check_within("y", y, y_ref, M, KAPPA, test_id)
    check_within("final_states", final, final_ref, final_M, KAPPA, test_id)
    assert not ready.any() and not errors.any()


def test_the_segmented_kernel_needs_its_arrays():
    inputs, _ = _stage_inputs(CASES[0])
    args = (inputs["x"], inputs["B"], inputs["C"], inputs["dt_out"], inputs["dA_cumsum"], None,
            None, None, None, inputs["x"], np.zeros((2, 4, 64, 64), np.float32), 1)
    one = Choice(1, 1, 64, None, 1)
    with pytest.raises(ValueError, match="^passed: .* takes passed of shape"):
        ssd_scan_launches(*args, one)
    passed = np.zeros((2, 4, 1, 64, 64), np.float32)
    for ready in (np.zeros((2, 4, 1, 2), np.int32), np.zeros((2, 4, 1, 1), np.float32)):
        with pytest.raises(ValueError, match="^ready: .* int32"):
            ssd_scan_launches(*args, one, passed=passed, ready=ready)
    assert ssd_scan_launches(*args, one, passed=passed,
                             ready=np.zeros((2, 4, 1, 1), np.int32))


def test_bad_arguments_are_refused_by_name_before_any_launch():
    inputs, _ = _stage_inputs(CASES[0])
    bad = {"dt_out": inputs["dt_out"][:, :, :1], "C": inputs["C"][:, :-1],
           "initial_states": np.ones((1, 1, 1, 1), np.float32),
           "seq_idx": np.zeros((1, 3), np.int32)}
    for name, value in bad.items():
        with recorded_launches() as launches, pytest.raises((ValueError, TypeError),
                                                            match=f"^{name}"):
            ssd_scan(**{**inputs, name: value})
        assert not launches, name


def test_a_d_that_is_not_finite_is_named_and_its_channels_are_nan():
    """The standalone scan reports D itself (check_D): on the interpreter (values checked on the
    host by default) a ValueError naming D before the launch; with check_values=False, the
    channel's y is NaN and the error is raised by the next call that reads the word."""
    from kernels import raise_pending_errors
    inputs, _ = _stage_inputs(CASES[[c.id for c in CASES].index("D_per_channel")])
    D = inputs["D"].copy()
    D[1, 3] = np.inf
    with recorded_launches() as launches, pytest.raises(ValueError, match="^D"):
        ssd_scan(**{**inputs, "D": D})
    assert not launches
    y, _ = ssd_scan(**{**inputs, "D": D}, check_values=False)
    assert np.isnan(y[:, :, 1, 3]).all() and np.isfinite(y[:, :, 0]).all()
    with pytest.raises(ValueError, match="D"):
        raise_pending_errors()
