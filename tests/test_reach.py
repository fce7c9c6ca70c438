"""The reach model (properties/reach.py): the classes of a launch, the classes reachable at a
profile's caps, the record of the suite's launches and the check that fails on a class never
launched (the check itself runs at the end of a whole property run: conftest.py)."""

import dataclasses

import numpy as np
import pytest

from contract import Dims
from kernels import fwd_pass_state, ssd_forward
from properties.checks import forward_bf16_bound
from properties.profiles import CAPS
from properties.reach import Record, beyond_caps, classes, launches, reachable, report
from properties.strategies import drawable, problem, spec_of
from shapes import Case, make_inputs

CI = CAPS["ci"]


@pytest.fixture(scope="module")
def ci_reach():
    return reachable(CI, 1)


def _classes_of(d: Dims, opts=None, sm_count=1) -> set[str]:
    return {c for launch in launches(d, opts or {}, sm_count) for c in classes(*launch)}


def test_classes_read_block_counts_from_the_launch():
    found = _classes_of(Dims(1, 70, 20, 145, 1, 140, 32), dict(D="channel", z=True))
    for c in ["_compute_out_kernel: headdim blocks = 3+/partial",
              "_fwd_pass_state_kernel: headdim blocks = 3+/partial",
              "_fwd_pass_state_kernel: dstate blocks = 2/partial",
              "_chunk_cumsum_kernel: head blocks = 2/partial",
              "_compute_out_kernel: dstate tile = padded", "_compute_out_kernel: D = channel",
              "_compute_out_kernel: z = True", "_compute_out_kernel: token blocks = 3+/partial",
              "_chunk_cumsum_kernel: chunks = 3+/partial"]:
        assert c in found, c
    # the program per chunk: float32, no seq_idx, a state tile of at most 128
    assert "_compute_out_chunk_kernel: headdim blocks = 3+/partial" in _classes_of(
        Dims(1, 70, 4, 145, 1, 100, 32))
    one = _classes_of(Dims(1, 64, 4, 64, 1, 64, 64))
    assert "_compute_out_kernel: headdim blocks = 1/full" in one
    assert "_compute_out_kernel: token blocks per chunk = 1" in one
    assert "_chunk_cumsum_kernel: chunks = 1/full" in one


def test_the_ci_caps_reach_past_the_largest_tiles(ci_reach):
    """Wide examples (short, large dimensions) put second and third blocks within the ci caps;
    what no drawable size reaches is not required (three full headdim blocks need 192)."""
    for c in ["_compute_out_kernel: headdim blocks = 2/partial",
              "_compute_out_kernel: headdim blocks = 3+/partial",
              "_fwd_pass_state_kernel: dstate blocks = 2/partial",
              "_state_pass_kernel: dstate blocks = 3+/partial",
              "_chunk_cumsum_kernel: head blocks = 2/partial",
              "_compute_out_kernel: head blocks per group = 2",
              "_compute_out_kernel: heads per program = 2",
              "_compute_out_chunk_kernel: object = int32, occupancy 1",
              "_fwd_pass_state_kernel: mode = parallel_chunks",
              # the layouts and the weights' dtypes the properties draw
              "_compute_out_chunk_kernel: x layout = strided",
              "_ssd_varlen_kernel: z layout = strided",
              "_fwd_pass_state_kernel: B layout = strided last axis",
              "_chunk_cumsum_kernel: dt dtype = float16",
              "_state_pass_kernel: initial_states dtype = bfloat16",
              "_ssd_scan_kernel: D dtype = bfloat16"]:
        assert c in ci_reach, c
    assert "_compute_out_kernel: headdim blocks = 3+/full" not in ci_reach
    assert not any("int64" in c for c in ci_reach)
    assert len(ci_reach) > 120


def test_a_narrower_profile_reaches_fewer_classes(ci_reach):
    narrow = dataclasses.replace(CI, wide_cost=0)
    fewer = reachable(narrow, 1)
    assert fewer < ci_reach
    assert "_compute_out_kernel: headdim blocks = 2/partial" in ci_reach - fewer


def test_drawable_follows_the_caps_and_the_cost_model():
    assert drawable(Dims(2, 300, 4, 64, 2, 64, 256), CI)
    assert drawable(Dims(1, 80, 4, 145, 1, 16, 64), CI)  # wide: short and cheap
    assert not drawable(Dims(1, 300, 4, 145, 1, 16, 64), CI)  # wide but long
    assert not drawable(Dims(1, 80, 20, 145, 1, 145, 64), CI)  # past the wide cost
    assert not drawable(Dims(1, 80, 6, 16, 4, 16, 64), CI)  # groups must divide heads
    assert not drawable(Dims(1, 80, 4, 16, 1, 16, 48), CI)  # not a chunk size


def test_int64_objects_are_beyond_the_caps():
    beyond = beyond_caps(132)
    assert "_compute_out_kernel: object = int64, occupancy 2" in beyond
    assert "_fwd_pass_state_kernel: object = int64, occupancy 2" in beyond
    _, table = report({}, set(), beyond)
    assert "tests/test_ssd_forward.py::test_seqlen_2_pow_20" in table


def test_record_counts_the_launches_of_each_property_and_restores_launch():
    from kernels.arrays import Backend
    launch = Backend.launch
    record = Record()
    kw = make_inputs(Case("reach_small", 1, 40, 2, 8, 1, 8, 16, D="head"))
    with record.recording("forward"):
        ssd_forward(**kw)
    assert Backend.launch is launch
    ssd_forward(**kw)  # outside the block: not recorded
    launched = record.as_dict()["launched"]
    assert launched["_ssd_scan_kernel: D = head"] == {"forward": 1}  # one SM: the scan
    assert launched["_chunk_cumsum_kernel: chunks = 3+/partial"] == {"forward": 1}
    assert record.sm_counts == {1} and record.properties() == {"forward"}
    other = Record()
    other.merge(record.as_dict())
    other.merge(record.as_dict())
    assert other.as_dict()["launched"]["_ssd_scan_kernel: D = head"] == {"forward": 2}


def test_the_check_names_every_class_never_launched_and_cannot_pass_on_nothing():
    record = Record()
    record.sm_counts = {1}
    kw = make_inputs(Case("reach_small", 1, 40, 2, 8, 1, 8, 16))
    with record.recording("forward"):
        ssd_forward(**kw)
    small = dataclasses.replace(CI, batch=1, seqlen=40, nheads=2, headdim=8, dstate=8,
                                chunk_sizes=(16,), wide_cost=0)
    missing, table = record.check(small)
    assert "_ssd_scan_kernel: D = head" in missing  # the options were never on
    assert "_ssd_scan_kernel: D = none" not in missing
    assert "MISSING" in table and "forward" in table
    missing, _ = Record().check(small)
    assert len(missing) == len(reachable(small, 1))


def test_classes_read_each_arrays_layout_and_each_weights_dtype():
    """A launch's classes tell, of each array the properties lay out, whether it is strided,
    and each weight's dtype: a bfloat16 forward on views of one projection, 16-bit weights."""
    record = Record()
    p = problem(spec_of(Dims(2, 40, 2, 8, 1, 8, 16), dict(
        D="head", z=True, dt_bias=True, initial_states=True, layout="projection",
        weights="activation", narrow_A=True)))
    with record.recording("forward_bf16_bound"):
        forward_bf16_bound(p, "interpreter")
    launched = record.as_dict()["launched"]
    for c in ["_chunk_cumsum_kernel: dt layout = strided",
              "_chunk_cumsum_kernel: dt dtype = bfloat16",
              "_chunk_cumsum_kernel: A dtype = bfloat16",
              "_chunk_cumsum_kernel: D dtype = bfloat16",
              "_ssd_scan_kernel: x layout = strided", "_ssd_scan_kernel: z layout = strided",
              "_ssd_scan_kernel: initial_states layout = contiguous",
              "_ssd_scan_kernel: initial_states dtype = bfloat16"]:
        assert c in launched, c
    assert not any("A layout" in c for c in launched)  # the properties never lay A out


def test_kernels_alone_record_their_own_classes():
    record = Record()
    kw = make_inputs(Case("reach_states", 1, 300, 2, 80, 1, 16, 128))
    dt_out = np.zeros((1, 2, 3, 128), np.float32)
    with record.recording("alone"):
        fwd_pass_state(kw["x"], kw["B"], dt_out, dt_out)
    launched = record.as_dict()["launched"]
    assert "_fwd_pass_state_kernel: headdim blocks = 2/partial" in launched
    assert not any(c.startswith("_compute_out") for c in launched)


def test_the_cover_launches_every_reachable_class():
    """The explicit examples of the reach model's cover (tests/test_properties.py) launch every
    class reachable at the caps, each kind of problem through its property's launches (the
    forward's but its scan's, which ssd_scan_alone's launches count for: kind_classes)."""
    from properties.reach import cover, kind_classes
    small = dataclasses.replace(CI, batch=2, seqlen=70, nheads=3, headdim=40, dstate=40,
                                chunk_sizes=(16, 64), wide_nheads=18, wide_headdim=70,
                                wide_dstate=70, wide_seqlen=20, wide_cost=20 * 18 * 70 * 70)
    chosen = cover(small, 1)
    launched = set()
    for kind, d, options, params in chosen:
        assert drawable(d, small), d
        launched |= kind_classes(kind, d, dict(options), 1, params)
    assert launched == reachable(small, 1)
    assert len(chosen) < 50  # a few problems, not the enumeration


def test_stored_results_equal_fresh_ones_and_follow_the_sources(monkeypatch, tmp_path):
    """reachable() and cover() read what an earlier process stored for the same caps, SM count
    and sources: equal to a fresh computation; another version of the sources stores anew."""
    from properties import reach
    small = dataclasses.replace(CI, batch=1, seqlen=40, nheads=2, headdim=20, dstate=20,
                                chunk_sizes=(16,), wide_cost=0, reach=True)
    monkeypatch.setattr(reach, "STORE", tmp_path)

    def fresh():
        for f in (reach.reachable, reach.cover, reach._candidates):
            f.cache_clear()
        return reach.reachable(small, 1), reach.cover(small, 1)
    computed = fresh()
    assert len(list(tmp_path.glob("*.json"))) == 2
    assert fresh() == computed and computed[0] and computed[1]  # read back from the store
    monkeypatch.setattr(reach, "_sources_digest", lambda: "another version")
    assert fresh() == computed and len(list(tmp_path.glob("*.json"))) == 4
