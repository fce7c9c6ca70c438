"""The property suite (`pytest -m properties`): every property of properties/checks.py under
Hypothesis, on the backend of the `backend` fixture (GPU if present, else the CPU interpreter;
`--backend` forces one), plus the replay of every stored reproducer.

Each test draws sizes, options, decays and a seed (properties/strategies.py), runs the kernels,
and reports the observed bound ratios with hypothesis.target so the nightly search climbs toward
the worst case.
"""

from pathlib import Path

import pytest
from hypothesis import example, given, target

from properties.checks import PROPERTIES, bad_value_examples, run
from properties.profiles import caps
from properties.reach import COVER_PROPERTY, cover
from properties.strategies import Problem, problem, spec_of

pytestmark = pytest.mark.properties

REPRODUCERS = sorted((Path(__file__).parent.parent / "properties" / "reproducers").glob("*.npz"))


def check(name, problem, backend, reach):
    """Property `name` on `problem`, its launches recorded for the reach check (conftest.py)."""
    with reach.recording(name):
        metrics = run(name, problem, backend)
    for label, value in metrics.items():
        target(value, label=label)


# pytest-xdist sends each process two consecutive tests first: the tests that compile many
# kernels on the GPU come first, each followed by one that compiles few
@given(problem=PROPERTIES["compute_out_alone"].strategy())
def test_compute_out_alone_within_tf32_bound(problem, backend, reach):
    check("compute_out_alone", problem, backend, reach)


@given(problem=PROPERTIES["ssd_scan_alone"].strategy())
def test_ssd_scan_alone_within_forward_bounds(problem, backend, reach):
    check("ssd_scan_alone", problem, backend, reach)


@given(problem=PROPERTIES["chunk_cumsum_alone"].strategy())
def test_chunk_cumsum_alone_within_bound(problem, backend, reach):
    check("chunk_cumsum_alone", problem, backend, reach)


@given(problem=PROPERTIES["fwd_pass_state_alone"].strategy())
def test_fwd_pass_state_alone_within_tf32_bound(problem, backend, reach):
    check("fwd_pass_state_alone", problem, backend, reach)


@given(problem=PROPERTIES["cumsum_non_increasing"].strategy())
def test_cumsum_non_increasing(problem, backend, reach):
    check("cumsum_non_increasing", problem, backend, reach)


@given(problem=PROPERTIES["forward_tf32_bound"].strategy())
def test_forward_within_tf32_bound(problem, backend, reach):
    check("forward_tf32_bound", problem, backend, reach)


@given(problem=PROPERTIES["causal_prefix"].strategy())
def test_causal_prefix_unchanged_by_later_tokens(problem, backend, reach):
    check("causal_prefix", problem, backend, reach)


@given(problem=PROPERTIES["varlen_packed"].strategy())
def test_varlen_packed_equals_a_call_per_sequence(problem, backend, reach):
    check("varlen_packed", problem, backend, reach)


@given(problem=PROPERTIES["seq_idx_packing"].strategy())
def test_seq_idx_packing_equals_separate_calls(problem, backend, reach):
    check("seq_idx_packing", problem, backend, reach)


@given(problem=PROPERTIES["determinism"].strategy())
def test_two_runs_bit_identical(problem, backend, reach):
    check("determinism", problem, backend, reach)


@given(problem=PROPERTIES["chunk_size_invariance"].strategy())
def test_chunk_size_invariance(problem, backend, reach):
    check("chunk_size_invariance", problem, backend, reach)


@given(problem=PROPERTIES["head_permutation"].strategy())
def test_head_permutation_within_groups(problem, backend, reach):
    check("head_permutation", problem, backend, reach)


@given(problem=PROPERTIES["forward_fp16_bound"].strategy())
def test_forward_float16_inputs_within_narrow_bound(problem, backend, reach):
    check("forward_fp16_bound", problem, backend, reach)


@given(problem=PROPERTIES["forward_bf16_bound"].strategy())
def test_forward_bfloat16_inputs_within_narrow_bound(problem, backend, reach):
    check("forward_bf16_bound", problem, backend, reach)


@given(problem=PROPERTIES["extreme_decays_finite_and_bounded"].strategy())
def test_extreme_decays_finite_and_bounded(problem, backend, reach):
    check("extreme_decays_finite_and_bounded", problem, backend, reach)


@given(problem=PROPERTIES["split_carries_state"].strategy())
def test_split_sequence_carries_final_state(problem, backend, reach):
    check("split_carries_state", problem, backend, reach)


@given(problem=PROPERTIES["ragged_equals_padded"].strategy())
def test_ragged_last_chunk_equals_zero_padded(problem, backend, reach):
    check("ragged_equals_padded", problem, backend, reach)


@given(problem=PROPERTIES["linearity_in_x"].strategy())
def test_linearity_in_x(problem, backend, reach):
    check("linearity_in_x", problem, backend, reach)


@given(problem=PROPERTIES["bad_values"].strategy())
def test_bad_values_feed_nan_and_name_their_argument(problem, backend, reach):
    check("bad_values", problem, backend, reach)


for _p in bad_value_examples():  # run before the drawn examples, whatever the draws are
    test_bad_values_feed_nan_and_name_their_argument = example(problem=_p)(
        test_bad_values_feed_nan_and_name_their_argument)


# The reach model's cover (properties.reach.cover): a few problems that launch every class
# reachable at the profile's caps, each run by the property of its kind, so that the suite
# launches every class whatever the drawn examples are (none where the profile asks no reach).
# One test each, so that pytest-xdist spreads them over its processes.
COVER = cover(caps(), 1) if caps().reach else ()


@pytest.mark.parametrize("kind, dims, options, params", COVER,
                         ids=[f"{kind}_{i}" for i, (kind, *_) in enumerate(COVER)])
def test_cover_problem_holds_its_property(kind, dims, options, params, backend, reach):
    p = problem(spec_of(dims, dict(options))).replace(params=params or {})
    with reach.recording(COVER_PROPERTY[kind]):
        run(COVER_PROPERTY[kind], p, backend)


def test_every_property_has_a_test():
    tested = {name for name in PROPERTIES
              if f'"{name}"' in Path(__file__).read_text()}
    assert tested == set(PROPERTIES)


@pytest.mark.parametrize("path", REPRODUCERS, ids=[p.stem for p in REPRODUCERS])
def test_stored_reproducer_holds(path, backend, reach):
    """A failure found once (by the fuzzer) stays fixed: its stored inputs pass its property."""
    name, problem = Problem.load(path)
    with reach.recording(f"reproducer {path.stem}"):
        run(name, problem, backend)
