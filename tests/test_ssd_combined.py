"""The drop-in where real layers call it: kernels.ssd_combined.mamba_chunk_scan_combined with the
arguments mamba_ssm's Mamba2 layer passes, built here without mamba_ssm (its `forward`, the
path without the fused kernel): z, x, B, C and dt as torch.split views of one projection
(batch, seqlen, 2 d_ssm + 2 ngroups dstate + nheads), dt and dt_bias in the model's dtype, A
and D float32; training (y), inference prefill (return_final_states) and packed prefill
(cu_seqlens, seq_idx, both states returned). Each against the float64 reference within its
derived bound; on the interpreter (CPU) and on the GPU (bfloat16 as torch tensors).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import reference as R
from kernels.ssd_combined import mamba_chunk_scan_combined
from kernels.call import Call
from kernels.plan import plan_of
from properties.bounds import narrow_output_bound
from properties.compare import check_close, forward_bounds
from properties.runner import to_host
from properties.strategies import to_backend
from properties.strategies import Problem

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size, D per channel, z, dt_limit)
LAYERS = {
    "rmsnorm_gated": (2, 150, 4, 16, 1, 32, 64, False, False, (0.0, math.inf)),
    "z_channel_D_groups": (1, 97, 4, 24, 2, 16, 32, True, True, (1e-3, 0.1)),
}


def _backend(backend: str, dtype: str) -> str:
    """Where the arrays live: bfloat16 runs on torch tensors on the GPU (CuPy has none)."""
    return "torch" if backend == "gpu" and dtype == "bfloat16" else backend


def layer_call(layer: str, dtype: str, where: str, seed: int = 0):
    """(arguments as the layer passes them on `where`, the same values as float64 NumPy)."""
    b, seqlen, h, p, g, n, cs, channel_D, gated, dt_limit = LAYERS[layer]
    rng = np.random.default_rng(seed)
    narrow = DTYPES[dtype]
    d_ssm = h * p
    width = 2 * d_ssm + 2 * g * n + h
    projection = rng.standard_normal((b, seqlen, width)).astype(narrow)
    projection[..., -h:] = rng.uniform(-4.0, 0.0, (b, seqlen, h))  # raw dt, before softplus
    on = to_backend(projection, where)
    views = dict(z=on[..., :d_ssm], x=on[..., d_ssm:2 * d_ssm],
                 B=on[..., 2 * d_ssm:2 * d_ssm + g * n], C=on[..., 2 * d_ssm + g * n:-h],
                 dt=on[..., -h:])
    shapes = dict(z=(b, seqlen, h, p), x=(b, seqlen, h, p), B=(b, seqlen, g, n),
                  C=(b, seqlen, g, n))
    args = {k: v.reshape(shapes[k]) if k in shapes else v for k, v in views.items()}
    if not gated:
        args["z"] = None
    A = -np.exp(rng.uniform(0.0, math.log(16.0), h)).astype(np.float32)
    D = rng.standard_normal((h, p) if channel_D else h).astype(np.float32)
    dt_bias = rng.uniform(-4.0, -2.0, h).astype(narrow)
    args.update(A=to_backend(A, where), D=to_backend(D, where),
                dt_bias=to_backend(dt_bias, where), chunk_size=cs, dt_softplus=True,
                dt_limit=dt_limit)
    wide = {k: (np.asarray(to_host(v), np.float64) if hasattr(v, "shape") else v)
            for k, v in args.items() if v is not None}
    return args, wide


def check_forward(what: str, y, final, wide: dict, dtype: str, stored_states: bool):
    """y and final_states against the float64 recurrence of the same values, within bounds."""
    p = Problem(**wide)
    y_ref, final_ref = R.ssd_recurrent(p.x, p.dt, p.A, p.B, p.C, **p.options())
    operands = "bfloat16" if dtype == "bfloat16" else "tfloat32"
    b = forward_bounds(p, operands=operands, stored_states=stored_states)
    check_close(f"{what} y", np.asarray(to_host(y), np.float64), y_ref,
                narrow_output_bound(y_ref, b.y, dtype), b.M, p, floor=b.floor)
    if final is not None:
        check_close(f"{what} final_states", to_host(final), final_ref, b.final, b.final_M, p,
                    floor=b.floor)


def _planned(args: dict):
    return plan_of(Call(**args))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_calls_within_bound_without_copies(layer, dtype, backend):
    """Training and inference prefill as the layer calls: y (x's dtype) and the final state
    (float32) within their bounds, and no input copied on the way (the plan's copies)."""
    where = _backend(backend, dtype)
    args, wide = layer_call(layer, dtype, where)
    plan = _planned(args)
    assert plan.copies == (), f"the layer's views were copied: {plan.copies}"
    stored = dtype == "bfloat16" and any(n == "chunk_states" for n, _, _ in plan.outputs)
    y = mamba_chunk_scan_combined(**args, seq_idx=None, cu_seqlens=None,
                                  return_final_states=False, return_varlen_states=False)
    assert to_host(y).dtype == DTYPES[dtype]
    check_forward("training", y, None, wide, dtype, stored)
    y, final = mamba_chunk_scan_combined(**args, return_final_states=True)
    assert to_host(final).dtype == np.float32
    check_forward("prefill", y, final, wide, dtype, stored)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_packed_prefill_returns_both_states(dtype, backend):
    """Packed prefill as the layer calls it with inference params: seq_idx and cu_seqlens of the
    row's sequences, both flags: (y, last state, varlen states), each sequence within the bound
    of its own forward, the last state the last sequence's."""
    where = _backend(backend, dtype)
    args, wide = layer_call("z_channel_D_groups", dtype, where, seed=1)
    offsets = np.array([0, 30, 30, 97], np.int32)  # an empty sequence in the middle
    each = np.repeat(np.arange(3, dtype=np.int32), np.diff(offsets))[None]
    y, last, states = mamba_chunk_scan_combined(
        **args, seq_idx=to_backend(each, where), cu_seqlens=to_backend(offsets, where),
        return_final_states=True, return_varlen_states=True)
    y, last, states = (to_host(a) for a in (y, last, states))
    assert states.shape[0] == 3 and last.shape[0] == 1
    np.testing.assert_array_equal(last, states[-1:])
    for k, (lo, hi) in enumerate(zip(offsets, offsets[1:])):
        if lo == hi:  # an empty sequence: its state is its initial one, zeros
            np.testing.assert_array_equal(states[k], 0.0)
            continue
        part = {n: (v[:, lo:hi] if n in ("x", "dt", "B", "C", "z") else v) for n, v in wide.items()}
        check_forward(f"sequence {k}", y[:, lo:hi], states[k:k + 1], part, dtype, False)


def test_a_row_state_seeds_the_first_sequence(backend):
    """mamba_ssm's initial_states with cu_seqlens is the row's state (1, ...): it enters the first
    sequence only; a state of another shape is refused by name."""
    args, _ = layer_call("rmsnorm_gated", "float32", backend)
    args = {k: (v[:1] if k in ("x", "dt", "B", "C") else v) for k, v in args.items()}
    offsets = to_backend(np.array([0, 70, 150], np.int32), backend)
    h, p, n = 4, 16, 32
    row = to_backend(np.random.default_rng(2).standard_normal((1, h, p, n)).astype(np.float32),
                     backend)
    y_row, states_row = mamba_chunk_scan_combined(**args, initial_states=row,
                                                  cu_seqlens=offsets, return_varlen_states=True)
    y_zero, states_zero = mamba_chunk_scan_combined(**args, cu_seqlens=offsets,
                                                    return_varlen_states=True)
    y_row, y_zero = to_host(y_row), to_host(y_zero)
    assert not np.array_equal(y_row[:, :70], y_zero[:, :70])
    np.testing.assert_array_equal(y_row[:, 70:], y_zero[:, 70:])
    np.testing.assert_array_equal(to_host(states_row)[1], to_host(states_zero)[1])
    with pytest.raises(ValueError, match="initial_states"):
        mamba_chunk_scan_combined(**args, initial_states=to_backend(
            np.zeros((2, h, p, n), np.float32), backend), cu_seqlens=offsets,
            return_varlen_states=True)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_token_major_views_within_bound_without_copies(dtype, backend):
    """x, B, C as the layer makes them without causal_conv1d (torch's conv1d output transposed:
    unit stride along the tokens, not the channels) are read in place too, within the bound."""
    where = _backend(backend, dtype)
    args, wide = layer_call("z_channel_D_groups", dtype, where)
    for name in ("x", "B", "C"):
        host = np.ascontiguousarray(np.moveaxis(to_host(args[name]), 1, -1))  # tokens last
        on = to_backend(host, where)
        args[name] = on.movedim(-1, 1) if where == "torch" else np.moveaxis(on, -1, 1)
    plan = _planned(args)
    assert plan.copies == ()
    y, final = mamba_chunk_scan_combined(**args, return_final_states=True)
    stored = dtype == "bfloat16" and any(n == "chunk_states" for n, _, _ in plan.outputs)
    check_forward("token-major", y, final, wide, dtype, stored)


def test_reversed_views_are_copied_and_named():
    """A negative stride is the one layout copied (C-contiguous first): the plan names it."""
    args, _ = layer_call("rmsnorm_gated", "float32", "interpreter")
    args["x"] = args["x"][:, ::-1][:, ::-1]  # the same values, through a reversed view
    args["B"] = np.ascontiguousarray(args["B"][:, ::-1])[:, ::-1]
    assert _planned(args).copies == ("B",)


@pytest.mark.parametrize("name, dtype, message", [
    ("dt", np.float16, "dt must have a floating dtype in \\('float32', 'bfloat16'\\)"),
    ("dt_bias", np.float64, "dt_bias must have a floating dtype"),
    ("D", np.float16, "D must have a floating dtype"),
])
def test_other_dtypes_are_refused_by_name(name, dtype, message):
    """Only float32 or x's dtype: a float16 dt beside bfloat16 activations, a float64 dt_bias."""
    args, _ = layer_call("rmsnorm_gated", "bfloat16", "interpreter")
    args[name] = np.asarray(args[name], np.float32).astype(dtype)
    with pytest.raises(TypeError, match=message):
        mamba_chunk_scan_combined(**args)
