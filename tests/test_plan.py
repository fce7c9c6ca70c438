"""The plan cache of ssd_forward (kernels.plan.plan_of): a call reuses the plan of its signature
and runs no check, so the key must hold everything a plan reads. The property: over drawn
signatures, each a change away from an earlier one, the cached plan equals a freshly built one."""

import importlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

from kernels import tuning_table
from kernels.call import Call
from contract import Dims
from properties.compare import expected_state_dtype
from properties.runner import route_of
from properties.strategies import Signature, signatures

forward = importlib.import_module("kernels.plan")
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
        cached = forward.plan_of(Call(**kw))
        assert cached == forward.build(Call(**kw)), signature
        assert forward.plan_of(Call(**kw)) is cached  # kept: the second call builds nothing
        # chunk states (three kernels) in the dtype docs/api.md promises, x's where not float32
        narrow_states = {name: like_x for name, _, like_x in cached.outputs}.get("chunk_states")
        expected = expected_state_dtype(signature.dtype, signature.states)
        assert narrow_states in (None, expected != "float32"), (signature, expected)
        # the route asked for, where one is
        route, _ = route_of([[launch.kernel for launch in part] for part in cached.parts])
        assert signature.route in (None, route), (signature, route)


# the fields of a Call that signatures() does not draw, and the test that keys each instead:
# the packed row's (test_a_packed_row_has_a_kept_plan), check_values and the returns
# (test_the_flags_are_keyed)
NOT_DRAWN = ("cu_seqlens", "return_final_states", "return_varlen_states", "check_values")


def test_the_drawn_changes_cover_every_field_of_a_call_in_every_aspect():
    """The fields come from Call itself, so a field added there fails here until signatures()
    draws changes of it (or NOT_DRAWN names the test that keys it): an array's shape, dtype,
    strides (not seq_idx's: the kernels read its segment ids, made C-contiguous) and, where
    optional, presence; any other field's value. And a 16-bit signature with every option
    admits every change."""
    from kernels.call import INPUTS
    from properties.strategies import MUTATION_CHANGES, _mutations
    covered = set().union(*MUTATION_CHANGES.values())
    for name in Call._fields:
        if name in NOT_DRAWN:
            continue
        if name in INPUTS:
            aspects = {"shape", "dtype"} | ({"strides"} if name != "seq_idx" else set()) | (
                {"presence"} if name in Call._field_defaults else set())
        else:
            aspects = {"value"}
        assert {(name, a) for a in aspects} <= covered, (name, aspects)
    full = Signature(Dims(2, 40, 4, 8, 2, 8, 16), "bfloat16", "head", True, True, True, True,
                     False, (0.0, math.inf), None)
    assert set(_mutations(full)) == set(MUTATION_CHANGES)


def test_the_plan_holds_no_array():
    kw = arguments(SMALL, "interpreter")
    plan = forward.build(Call(**kw))
    for part in plan.parts:
        for launch in part:
            assert not any(hasattr(a, "shape") for a in launch.args)


def test_a_key_tells_apart_what_compares_equal(no_plans):
    """256 and numpy's 256 compare equal but are keyed apart (their checks differ: a plan holds
    for arguments its checks passed), as are True and 1; an option that cannot be hashed (a
    NumPy array) is checked and planned on every call, never kept."""
    kw = arguments(SMALL, "interpreter")
    key = lambda **change: forward.key(Call(**dict(kw, **change)))
    assert key(chunk_size=64) != key(chunk_size=np.int64(64))
    assert key(dt_softplus=True) != key(dt_softplus=1)
    assert key(check_values=True) != key(check_values=np.bool_(True))
    plan = forward.plan_of(Call(**dict(kw, dt_softplus=np.array(True))))
    assert plan == forward.build(Call(**dict(kw, dt_softplus=True)))
    assert forward._PLANS == {}
    # a list dt_limit is kept, apart from the tuple of its values
    listed = forward.plan_of(Call(**dict(kw, dt_limit=[1e-3, 0.1])))
    assert forward.plan_of(Call(**dict(kw, dt_limit=[1e-3, 0.1]))) is listed
    assert key(dt_limit=[1e-3, 0.1]) != key(dt_limit=(1e-3, 0.1))


def test_the_flags_are_keyed(no_plans):
    """check_values decides whether a call checks values on the host: each value has its own
    plan (a plan of check_values=False handed to True would skip the host's check)."""
    kw = arguments(SMALL, "interpreter")
    plans = {flag: forward.plan_of(Call(**kw, check_values=flag)) for flag in (None, False, True)}
    assert {flag: plan.on_host for flag, plan in plans.items()} == {
        None: True, False: False, True: True}
    assert len({forward.key(Call(**kw, return_final_states=flag)) for flag in (False, True)}) == 2


def test_a_packed_row_has_a_kept_plan(no_plans):
    """A packed row's plan (chunk_cumsum, then ssd_varlen) is kept like a batch's: a second call
    builds nothing; another count of sequences is another key."""
    kw = arguments(SMALL, "interpreter")
    for name in ("initial_states", "seq_idx"):
        kw.pop(name, None)
    offsets = lambda *cut: np.array([0, *cut, 40], dtype=np.int32)
    first = forward.plan_of(Call(**kw, cu_seqlens=offsets(10)))
    assert first == forward.build(Call(**kw, cu_seqlens=offsets(10)))
    assert forward.plan_of(Call(**kw, cu_seqlens=offsets(20))) is first  # other values
    assert forward.plan_of(Call(**kw, cu_seqlens=offsets(10, 20))) is not first
    names = [launch.kernel._pyfunc.__name__ for part in first.parts for launch in part]
    assert names[0] == "_chunk_cumsum_kernel" and names[1:] and all(
        "varlen" in name for name in names[1:])


def test_a_hit_still_refuses_what_its_signature_refuses(no_plans):
    kw = arguments(SMALL, "interpreter")
    forward.plan_of(Call(**kw))
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        forward.plan_of(Call(**dict(kw, chunk_size=float(kw["chunk_size"]))))


def test_a_tuned_choice_recorded_later_is_a_new_key(no_plans, monkeypatch):
    kw = arguments(SMALL, "interpreter")
    before = forward.key(Call(**kw))
    monkeypatch.delenv(tuning_table.ENV, raising=False)  # no file written
    monkeypatch.setattr(tuning_table, "_TABLES", {})
    tuning_table.record("a device", ("a signature",), ("a choice",))
    assert forward.key(Call(**kw)) != before


def test_the_cache_keeps_at_most_max_plans(no_plans, monkeypatch):
    monkeypatch.setattr(forward, "MAX_PLANS", 3)
    kw = arguments(SMALL, "interpreter")
    for lo in (0.0, 1e-4, 1e-3, 1e-2):
        forward.plan_of(Call(**dict(kw, dt_limit=(lo, math.inf))))
    assert len(forward._PLANS) == 3


def test_an_unsupported_array_type_is_refused_and_not_kept(no_plans):
    kw = arguments(SMALL, "interpreter")
    with pytest.raises(TypeError, match="x: unsupported array type list"):
        forward.plan_of(Call(**dict(kw, x=kw["x"].tolist())))
    assert forward._PLANS == {}


@pytest.mark.parametrize("backend", ["interpreter", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_ssd_forward_through_a_kept_plan_equals_its_launchers_on_the_arrays(backend, no_plans):
    """Two calls of one signature (the second through the kept plan) on other values give bit
    for bit the results of forward_launches run on the call's own arrays (the tuner's path:
    the plan's arrays and batch slices, no plan binding its launches)."""
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
    from kernels.launches import forward_launches
    call = Call(**kw)
    plan = forward.plan_of(call)
    backend = plan.backend
    arrays = plan.arrays(call)
    word = errors.scratch_word(backend)
    backend.launch_parts([forward_launches(dataclasses.replace(p.arrays, errors=word),
                                           p.sm_count) for p in plan.forward_parts(arrays)])
    return arrays["y"], arrays["final_states"]


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
        cached = forward.plan_of(Call(**kw, state_dtype=state_dtype))
        assert cached == forward.build(Call(**kw, state_dtype=state_dtype)), state_dtype
    dtypes = {state_dtype: dict((n, x) for n, _, x in forward.plan_of(
        Call(**kw, state_dtype=state_dtype)).outputs)["chunk_states"]
        for state_dtype in ("float32", None)}
    assert dtypes == {"float32": False, None: True}  # float32, and x's bfloat16 by default
