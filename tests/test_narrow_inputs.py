"""Narrow inputs: x, B, C, z in float16 (CPU interpreter, and CuPy on the GPU) or bfloat16 (CPU
interpreter, as ml_dtypes' NumPy bfloat16 arrays, and torch tensors on the GPU: CuPy has no
bfloat16), everything else float32; y in the inputs' dtype, final_states float32.

The reference is the float64 forward of the narrow values themselves (upcast), and the bound
is properties/bounds.py's narrow_output_bound: the float32 bound, plus the one rounding of y to
the narrow format. The stage tests' table runs in float32; here a few of its cases run narrow.
"""

import ml_dtypes
import numpy as np
import pytest

import reference as R
from kernels import chunk_cumsum, compute_out, fwd_pass_state, ssd_forward, ssd_scan
from kernels.arrays import launch_dims
from kernels.call import Call
from kernels.fwd_pass_state import MODES
from kernels.fwd_pass_state import rules_choice as fwd_pass_state_rules
from kernels.plan import plan_of
from properties.bounds import narrow_output_bound
from properties.checks import FP16_PUSH
from properties.compare import check_close, forward_bounds
from properties.runner import to_host
from properties.strategies import Problem
from shapes import BACKENDS, CASES, make_inputs, on_backend, step_options

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")

ACTIVATIONS = ("x", "B", "C", "z")
BY_ID = {c.id: c for c in CASES}
# the table's cases that the default run runs (the interpreter takes them in seconds)
NARROW_CASES = [c.id for c in CASES if not c.marks]


def narrow(kw: dict, cast) -> dict:
    """`kw` with the activations passed through `cast` (the others unchanged)."""
    return {k: cast(v) if k in ACTIVATIONS else v for k, v in kw.items()}


def expected(kw: dict, dtype: str):
    """(y_ref, final_ref, y bound, final bound, the problem) for NumPy inputs `kw` whose
    activations hold the narrow values (any float dtype): the float64 forward of those values."""
    up = {k: np.asarray(v, np.float64) if isinstance(v, np.ndarray) and (
        v.dtype.kind == "f" or v.dtype == ml_dtypes.bfloat16) else v for k, v in kw.items()}
    p = Problem(**up)
    y_ref, final_ref = R.ssd_chunked(p.x, p.dt, p.A, p.B, p.C, p.chunk_size, **p.options())
    b = forward_bounds(p, operands=dtype)
    return y_ref, final_ref, narrow_output_bound(y_ref, b.y, dtype), b.final, b, p


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_id", NARROW_CASES)
def test_float16_inputs_within_narrow_bound(case_id, backend):
    kw = narrow(make_inputs(BY_ID[case_id]), lambda a: a.astype(np.float16))
    y, final = (to_host(a) for a in ssd_forward(**on_backend(backend, kw),
                                                return_final_states=True))
    assert y.dtype == np.float16 and final.dtype == np.float32
    y_ref, final_ref, y_bound, final_bound, b, p = expected(kw, "float16")
    check_close("y", y, y_ref, y_bound, b.M, p)
    check_close("final_states", final, final_ref, final_bound, b.final_M, p)


@pytest.mark.parametrize("case_id", NARROW_CASES)
def test_bfloat16_inputs_on_the_interpreter_within_narrow_bound(case_id):
    kw = narrow(make_inputs(BY_ID[case_id]), lambda a: a.astype(ml_dtypes.bfloat16))
    y, final = ssd_forward(**kw, return_final_states=True)
    assert y.dtype == ml_dtypes.bfloat16 and final.dtype == np.float32
    y_ref, final_ref, y_bound, final_bound, b, p = expected(kw, "bfloat16")
    check_close("y", y.astype(np.float64), y_ref, y_bound, b.M, p)
    check_close("final_states", final, final_ref, final_bound, b.final_M, p)


def test_float16_stages_compose_to_ssd_forward():
    """The launchers take float16 activations too: chunk_cumsum and ssd_scan (the interpreter's
    forward: one SM) compose to ssd_forward's bits, and chunk_cumsum, fwd_pass_state and
    compute_out to a y and final state within the float16 bound."""
    kw = narrow(make_inputs(BY_ID["all_options_chunk16"]), lambda a: a.astype(np.float16))
    cs = kw["chunk_size"]
    dt_out, dA_cumsum = chunk_cumsum(kw["dt"], kw["A"], cs, **step_options(kw))
    y_forward, final_forward = ssd_forward(**kw, return_final_states=True)
    y, final = ssd_scan(kw["x"], kw["B"], kw["C"], dt_out, dA_cumsum, D=kw["D"], z=kw["z"],
                        initial_states=kw["initial_states"], seq_idx=kw["seq_idx"])
    assert y.dtype == np.float16 and final.dtype == np.float32
    assert np.array_equal(y.view(np.uint16), y_forward.view(np.uint16))
    assert np.array_equal(final.view(np.uint32), final_forward.view(np.uint32))
    chunk_states, final = fwd_pass_state(kw["x"], kw["B"], dt_out, dA_cumsum,
                                         kw["initial_states"], kw["seq_idx"])
    y = compute_out(kw["x"], kw["B"], kw["C"], dt_out, dA_cumsum, chunk_states, D=kw["D"],
                    z=kw["z"], seq_idx=kw["seq_idx"])
    assert y.dtype == np.float16 and chunk_states.dtype == np.float32
    y_ref, final_ref, y_bound, final_bound, b, p = expected(kw, "float16")
    check_close("y", y, y_ref, y_bound, b.M, p)
    check_close("final_states", final, final_ref, final_bound, b.final_M, p)


@pytest.mark.parametrize("arg", ["B", "C", "z"])
def test_mixed_activation_dtypes_refused(arg):
    kw = narrow(make_inputs(BY_ID["all_options_chunk16"]), lambda a: a.astype(np.float16))
    kw[arg] = kw[arg].astype(np.float32)
    with pytest.raises(TypeError, match=rf"{arg} must have x's dtype \(float16\), got float32"):
        ssd_forward(**kw)


def test_dt_of_another_narrow_dtype_refused():
    """dt (and A, D, dt_bias, initial_states) are float32 or the activations' dtype: a float16
    dt beside bfloat16 activations is refused by name."""
    kw = narrow(make_inputs(BY_ID["all_options_chunk16"]), lambda a: a.astype(ml_dtypes.bfloat16))
    kw["dt"] = kw["dt"].astype(np.float16)
    with pytest.raises(TypeError, match="dt must have a floating dtype in"):
        ssd_forward(**kw)


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", ["chunk128_ragged", "all_options_chunk256"])
def test_bfloat16_torch_inputs_within_narrow_bound(case_id):
    torch = pytest.importorskip("torch")
    kw = make_inputs(BY_ID[case_id])
    tkw = on_backend("torch", kw)
    tkw = narrow(tkw, lambda t: t.to(torch.bfloat16))
    y, final = ssd_forward(**tkw, return_final_states=True)
    assert y.dtype == torch.bfloat16 and final.dtype == torch.float32
    host = dict(kw)
    for k in ACTIVATIONS:  # the bfloat16 values themselves, exactly, for the reference
        if k in tkw:
            host[k] = tkw[k].float().cpu().numpy()
    y_ref, final_ref, y_bound, final_bound, b, p = expected(host, "bfloat16")
    check_close("y", y.float().cpu().numpy(), y_ref, y_bound, b.M, p)
    check_close("final_states", final.cpu().numpy(), final_ref, final_bound, b.final_M, p)


# float16 inputs whose computed operands float16 cannot hold unscaled (the scan's guard redoes
# the call on TF32 operands, the other kernels scale them, kernels.tiles.float16_scaled):
# activations scaled by powers of two (exact) so that one operand passes 65504 by far while y
# stays in float16's range. "weights": C B^T dt (B up, x down); "state": the state operand S
# (x and B up, C down); "scaled_x": w o x (x up, dt >= 2.5, B and C down). (x, B, C exponents,
# dt range)
PAST_FLOAT16 = {
    "weights": ((-12, 10, 6), (1e-3, 0.3)),
    "state": ((10, 6, -14), (0.5, 1.0)),
    "scaled_x": ((14, -10, -8), (2.5, 5.0)),
}


def _past_float16_inputs(regime: str) -> dict:
    """chunk64_ragged's inputs in float16 with one computed operand past float16's range."""
    (ex, eb, ec), (dt_lo, dt_hi) = PAST_FLOAT16[regime]
    kw = make_inputs(BY_ID["chunk64_ragged"], seed=3)
    rng = np.random.default_rng(4)
    kw["dt"] = rng.uniform(dt_lo, dt_hi, kw["dt"].shape).astype(np.float32)
    kw["A"] = np.full_like(kw["A"], -0.1)  # a long memory: the state grows with the tokens
    kw["x"] = np.clip(kw["x"], -2.0, 2.0)  # x * 2^14 stays below 65504
    for name, e in zip(("x", "B", "C"), (ex, eb, ec)):
        kw[name] = (kw[name] * np.float32(2.0 ** e)).astype(np.float16)
    return kw


def _past_operand(regime: str, kw: dict) -> float:
    """The largest float64 magnitude of the regime's computed operand (a lower bound of it)."""
    x, B, C, dt = (np.asarray(kw[n], np.float64) for n in ("x", "B", "C", "dt"))
    if regime == "weights":  # the diagonal of C B^T o L * dt: L = 1 there
        return float(np.max(np.abs(np.einsum("btgn,btgn->bt", C, B)[..., None] * dt)))
    if regime == "scaled_x":  # w o x at the token ending a block: w = dt
        return float(np.max(np.abs(x) * dt[..., None]))
    _, final = R.ssd_chunked(x, dt, kw["A"], B, C, kw["chunk_size"])
    return float(np.max(np.abs(final)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("regime", PAST_FLOAT16)
def test_float16_products_past_float16_range_stay_within_bound(regime, backend):
    """The forward (the interpreter's: the scan), the three stages and a packed row, each within
    the float16 bound where a computed operand passes float16's range (a product that rounded
    it to float16 would make it inf)."""
    kw = _past_float16_inputs(regime)
    assert _past_operand(regime, kw) >= FP16_PUSH  # the regime reaches past the range
    y_ref, final_ref, y_bound, final_bound, b, p = expected(kw, "float16")
    assert np.max(np.abs(y_ref)) < 2.0 ** 15  # y itself fits float16
    on = on_backend(backend, kw)
    y, final = (to_host(a) for a in ssd_forward(**on, return_final_states=True))
    check_close(f"{regime}: forward y", y, y_ref, y_bound, b.M, p, floor=b.floor)
    check_close(f"{regime}: forward final_states", final, final_ref, final_bound, b.final_M, p,
                floor=b.floor)
    dt_out, dA_cumsum = chunk_cumsum(on["dt"], on["A"], kw["chunk_size"])
    chunk_states, final = fwd_pass_state(on["x"], on["B"], dt_out, dA_cumsum)
    y = compute_out(on["x"], on["B"], on["C"], dt_out, dA_cumsum, chunk_states)
    check_close(f"{regime}: three stages y", to_host(y), y_ref, y_bound, b.M, p,
                floor=b.floor)
    check_close(f"{regime}: three stages final_states", to_host(final), final_ref, final_bound,
                b.final_M, p, floor=b.floor)
    row = {k: v[:1] if k in ("x", "dt", "B", "C") else v for k, v in on.items()}
    cu = on_backend(backend, {"cu": np.array([0, kw["x"].shape[1]], np.int32)})["cu"]
    y, states = (to_host(a) for a in ssd_forward(**row, cu_seqlens=cu,
                                                 return_varlen_states=True))
    check_close(f"{regime}: packed y", y, y_ref[:1], y_bound[:1], b.M[:1], p,
                floor=b.floor)
    check_close(f"{regime}: packed state", states, final_ref[:1], final_bound[:1],
                b.final_M[:1], p, floor=b.floor)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_chunk_states_within_bound(backend):
    """state_dtype bfloat16 (bfloat16 inputs): fwd_pass_state in each mode stores its chunk
    states in it, and with compute_out composes to a y within the forward's bound of stored
    bfloat16 states; so does ssd_forward, whose plan keeps them (three kernels: dstate 200 is
    past the scan's tile, and the GPU's grid is small)."""
    if backend == "gpu":  # CuPy has no bfloat16
        pytest.importorskip("torch")
        backend = "torch"
    dtype, narrow_dtype = "bfloat16", np.dtype(ml_dtypes.bfloat16)
    kw = narrow(make_inputs(BY_ID["headdim_100_dstate_200_chunk128"]),
                lambda a: a.astype(narrow_dtype))
    y_ref, final_ref, _, _, _, p = expected(kw, dtype)
    b = forward_bounds(p, operands=dtype, stored_states=True)
    y_bound = narrow_output_bound(y_ref, b.y, dtype)
    on = on_backend(backend, kw)
    dt_out, dA_cumsum = chunk_cumsum(on["dt"], on["A"], kw["chunk_size"], **step_options(on))
    for mode in MODES:
        choice = fwd_pass_state_rules(launch_dims(on["x"], on["B"], dt_out), 1)._replace(
            mode=mode)
        states, final = fwd_pass_state(on["x"], on["B"], dt_out, dA_cumsum, on["initial_states"],
                                       on["seq_idx"], choice=choice, state_dtype=dtype)
        final = to_host(final)
        assert to_host(states).dtype == narrow_dtype and final.dtype == np.float32
        y = compute_out(on["x"], on["B"], on["C"], dt_out, dA_cumsum, states,
                        seq_idx=on["seq_idx"])
        check_close(f"{mode}: y", to_host(y).astype(np.float64), y_ref, y_bound, b.M, p,
                    floor=b.floor)
        check_close(f"{mode}: final_states", final, final_ref, b.final, b.final_M, p,
                    floor=b.floor)
    plan = plan_of(Call(**on, state_dtype=narrow_dtype))
    assert ("chunk_states", p.dims.shape("chunk_states"), True) in plan.outputs  # x's dtype
    y, final = (to_host(a) for a in ssd_forward(**on, return_final_states=True,
                                                state_dtype=narrow_dtype))
    check_close("forward y", y.astype(np.float64), y_ref, y_bound, b.M, p, floor=b.floor)
    check_close("forward final_states", final, final_ref, b.final, b.final_M, p,
                floor=b.floor)


@pytest.mark.parametrize("dtype, state_dtype, error, match", [
    pytest.param("float32", "bfloat16", ValueError, r"state_dtype: must be one of \('float32',\)",
                 id="bfloat16_states_of_float32_inputs"),
    pytest.param("float16", np.float16, ValueError, r"state_dtype: .*would overflow past 65504",
                 id="float16_states"),
    pytest.param("bfloat16", "float64", ValueError, r"state_dtype: must be one of \('float32', "
                 r"'bfloat16'\)", id="float64"),
    pytest.param("float32", 3, TypeError, "state_dtype: must be a dtype", id="not_a_dtype"),
])
def test_state_dtype_refused_by_name(dtype, state_dtype, error, match):
    kw = narrow(make_inputs(BY_ID["all_options_chunk16"]),
                lambda a: a.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype))
    with pytest.raises(error, match=match):
        ssd_forward(**kw, state_dtype=state_dtype)
    row = {k: v[:1] for k, v in kw.items() if k in ("x", "dt", "B", "C")}
    with pytest.raises(error, match=match):  # the packed path checks it too (and keeps none)
        ssd_forward(**row, A=kw["A"], chunk_size=16, cu_seqlens=np.array([0, 16], np.int32),
                    state_dtype=state_dtype)
