"""The launch-plan cache of ssd_forward (kernels.ssd_forward.launch_plan): a call reuses the plan
of its signature, so the cache key must hold everything a plan reads. The property: over drawn
signatures, each a change away from an earlier one, the cached plan equals a freshly built one."""

import importlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

from kernels import tuning_table
from contract import Dims
from properties.checks import expected_state_dtype, route_of
from properties.strategies import Signature, signatures

forward = importlib.import_module("kernels.ssd_forward")
SMALL = Signature(Dims(1, 40, 2, 8, 1, 8, 16), "float32", "head", False, False, False, False,
                  False, (0.0, math.inf), None)


@pytest.fixture
def no_plans(monkeypatch):
    """An empty plan cache for the test."""
    monkeypatch.setattr(forward, "_PLANS", {})


def arguments(signature, backend):
    if backend == "gpu":
        import cupy
        return signature.arguments(cupy)
    return signature.arguments(np)


# float16 then bfloat16 (one item size), dstate past the scan's tile: their plans differ in the
# chunk states' dtype alone, so a key blind to the dtype shows here whatever the draws are
FP16_THEN_BF16 = [Signature(Dims(1, 40, 2, 8, 1, 200, 16), dtype, None, False, False, False,
                            False, False, (0.0, math.inf), None)
                  for dtype in ("float16", "bfloat16")]


@pytest.mark.properties
@given(drawn=signatures())
@example(drawn=FP16_THEN_BF16)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # one cache a test
def test_a_cached_plan_equals_a_fresh_one(drawn, backend, no_plans):
    for signature in drawn:
        kw = arguments(signature, backend)
        cached = forward.launch_plan(**kw)
        assert cached == forward.build_plan(**kw), signature
        assert forward.launch_plan(**kw) is cached  # kept: the second call builds nothing
        # chunk states (three kernels) in the dtype docs/api.md promises, x's where not float32
        narrow_states = {name: like_x for name, _, like_x in cached.outputs}.get("chunk_states")
        expected = expected_state_dtype(signature.dtype, signature.states)
        assert narrow_states in (None, expected != "float32"), (signature, expected)
        # the route asked for, where one is
        route, _ = route_of([[launch.kernel for launch in part] for part in cached.parts])
        assert signature.route in (None, route), (signature, route)


def test_the_drawn_changes_cover_every_parameter_of_build_plan_in_every_aspect():
    """The parameters come from build_plan itself, so a parameter added there fails here until
    signatures() draws changes of it: an array's shape, dtype, strides (not seq_idx's: the
    kernels read its segment ids, made C-contiguous) and, where optional, presence; any other
    parameter's value. And a 16-bit signature with every option admits every change."""
    import inspect
    from properties.strategies import MUTATION_CHANGES, _mutations
    covered = set().union(*MUTATION_CHANGES.values())
    for name, parameter in inspect.signature(forward.build_plan).parameters.items():
        if name in forward.INPUTS:
            aspects = {"shape", "dtype"} | ({"strides"} if name != "seq_idx" else set()) | (
                {"presence"} if parameter.default is None else set())
        else:
            aspects = {"value"}
        assert {(name, a) for a in aspects} <= covered, (name, aspects)
    full = Signature(Dims(2, 40, 4, 8, 2, 8, 16), "bfloat16", "head", True, True, True, True,
                     False, (0.0, math.inf), None)
    assert set(_mutations(full)) == set(MUTATION_CHANGES)


def test_the_plan_holds_no_array():
    kw = arguments(SMALL, "interpreter")
    plan = forward.build_plan(**kw)
    for part in plan.parts:
        for launch in part:
            assert not any(hasattr(a, "shape") for a in launch.args)


def test_a_key_tells_apart_what_compares_equal(no_plans):
    """256 and numpy's 256 compare equal but are keyed apart (their checks differ: a plan holds
    for arguments its checks passed); dt_softplus is keyed as the launchers read it, bool (so
    NumPy's True is a key too)."""
    kw = arguments(SMALL, "interpreter")
    assert (forward.plan_key(**dict(kw, chunk_size=64))
            != forward.plan_key(**dict(kw, chunk_size=np.int64(64))))
    assert (forward.plan_key(**dict(kw, dt_softplus=np.array(True)))
            == forward.plan_key(**dict(kw, dt_softplus=True)))


def test_a_hit_still_refuses_what_its_signature_refuses(no_plans):
    kw = arguments(SMALL, "interpreter")
    forward.launch_plan(**kw)
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        forward.launch_plan(**dict(kw, chunk_size=float(kw["chunk_size"])))


def test_a_tuned_choice_recorded_later_is_a_new_key(no_plans, monkeypatch):
    kw = arguments(SMALL, "interpreter")
    before = forward.plan_key(**kw)
    monkeypatch.delenv(tuning_table.ENV, raising=False)  # no file written
    monkeypatch.setattr(tuning_table, "_TABLES", {})
    tuning_table.record("a device", ("a signature",), ("a choice",))
    assert forward.plan_key(**kw) != before


def test_the_cache_keeps_at_most_max_plans(no_plans, monkeypatch):
    monkeypatch.setattr(forward, "MAX_PLANS", 3)
    kw = arguments(SMALL, "interpreter")
    for lo in (0.0, 1e-4, 1e-3, 1e-2):
        forward.launch_plan(**dict(kw, dt_limit=(lo, math.inf)))
    assert len(forward._PLANS) == 3


def test_an_unsupported_array_type_is_refused_and_not_kept(no_plans):
    kw = arguments(SMALL, "interpreter")
    with pytest.raises(TypeError, match="x: unsupported array type list"):
        forward.launch_plan(**dict(kw, x=kw["x"].tolist()))
    assert forward._PLANS == {}


@pytest.mark.parametrize("backend", ["interpreter", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_ssd_forward_through_a_kept_plan_equals_its_launchers_on_the_arrays(backend, no_plans):
    """Two calls of one signature (the second through the kept plan) on other values give bit
    for bit the results of forward_launches run on the call's own arrays (the tuner's path:
    no plan binding its launches)."""
    from kernels import ssd_forward
    s = Signature(Dims(2, 70, 4, 24, 2, 16, 32), "float32", "channel", True, True, True, True,
                  True, (1e-3, math.inf), 2, frozenset({"x", "dt"}))
    for seed in range(2):
        kw = arguments(s, backend)
        kw["x"] = kw["x"] * (seed + 1)
        got = ssd_forward(**kw, return_final_states=True)
        ref = _launched_on_the_arrays(kw)
        for a, b in zip(got, ref):
            assert np.array_equal(_host(a), _host(b))


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _launched_on_the_arrays(kw):
    import dataclasses
    from kernels import errors
    from kernels.ssd_forward import forward_launches, prepare_forward
    args = [kw[n] for n in ("x", "dt", "A", "B", "C", "chunk_size", "D", "z", "dt_bias",
                            "initial_states", "seq_idx", "dt_softplus", "dt_limit",
                            "batch_parts")]
    backend, parts, y, final_states = prepare_forward(*args)
    word = errors.scratch_word(backend)
    backend.launch_parts([forward_launches(dataclasses.replace(p.arrays, errors=word),
                                           p.sm_count) for p in parts])
    return y, final_states


@pytest.mark.properties
def test_state_dtype_is_keyed(no_plans):
    """bfloat16 inputs past the scan's dstate tile (three kernels, on the interpreter too): the
    chunk states' dtype is part of the plan, so each state_dtype gets its own, equal to a fresh
    one (a key blind to it would hand float32 states' plan to bfloat16 states)."""
    import ml_dtypes
    kw = Signature(Dims(1, 40, 2, 8, 1, 200, 16), "float32", None, False, False, False, False,
                   False, (0.0, math.inf), None).arguments(np)
    kw.update({k: kw[k].astype(ml_dtypes.bfloat16) for k in ("x", "B", "C")})
    del kw["state_dtype"]
    for state_dtype in ("float32", None, "float32", ml_dtypes.bfloat16):
        cached = forward.launch_plan(**kw, state_dtype=state_dtype)
        assert cached == forward.build_plan(**kw, state_dtype=state_dtype), state_dtype
    dtypes = {state_dtype: dict((n, x) for n, _, x in forward.launch_plan(
        **kw, state_dtype=state_dtype).outputs)["chunk_states"]
        for state_dtype in ("float32", None)}
    assert dtypes == {"float32": False, None: True}  # float32, and x's bfloat16 by default
