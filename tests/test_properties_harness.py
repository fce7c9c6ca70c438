"""The property harness itself: the mutant catalogue still applies to the kernel source, the ci
profile is the one loaded under CI, reproducers round-trip, the fuzzer's reproducer of a planted
bug replays (and fails only with the bug), the layouts are the views they say, and (slow, ~10
min) every mutant is killed."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hypothesis import find, given, settings

import reference as R
from contract import Dims
from properties import mutants
from properties import profiles
from properties.profiles import caps
from kernels.compute_out import compute_out_choices
from kernels.call import Call
from kernels.plan import plan_of
from properties.checks import compute_out_alone
from properties.runner import on_backend
from properties.strategies import (LAID_OUT, LAYOUTS, SHARED_HEADS_MIN_CHUNK, Bucket, Problem,
                                   Spec, _fixed_buckets, layout_strides, problem, spec_of, specs)

REPO = Path(__file__).resolve().parent.parent


def test_mutant_catalogue_applies_to_current_kernel_source():
    assert len(mutants.CATALOGUE) >= 10
    assert len(mutants.BY_NAME) == len(mutants.CATALOGUE), "mutant names must be unique"
    for m in mutants.CATALOGUE:
        mutants.check_applies(m)  # ValueError names the mutant whose text drifted
        assert m.old != m.new


def test_a_mutated_tree_runs_first_and_keeps_the_callers_pythonpath(tmp_path, monkeypatch):
    """python_in puts the mutated tree's packages first and keeps the caller's PYTHONPATH after
    them: a package the caller reaches only through PYTHONPATH (cuda-tile unpacked to a folder,
    as on a machine without an install) is still importable in the mutated tree."""
    extra = tmp_path / "site"
    (extra / "only_here").mkdir(parents=True)
    (extra / "only_here" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(extra), str(REPO)]))
    root = tmp_path / "tree"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "__init__.py").write_text("")
    out = mutants.python_in(root, ["-c", "import kernels, only_here; print(kernels.__file__)"])
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).parent == root / "kernels"


@settings(max_examples=50, derandomize=True, database=None)
@given(spec=specs(carried=True))
def test_carried_specs_hold_moderate_decays_over_two_chunks(spec):
    """specs(carried=True): two chunks or more within the caps, every head's largest decay over a
    chunk 10^0.25..10^1.25 (spread at most half a decade), so the carried state matters; a head
    whose processed dt is zero everywhere (a bias clamped away) has no decay at all."""
    assert spec.chunk_size < spec.seqlen <= caps().seqlen
    assert 0.25 <= spec.decay <= 1.25 and spec.decay_spread <= 0.5
    p = problem(spec)
    dt_out, _ = R.chunk_cumsum_ref(p.dt, p.A, p.chunk_size, p.dt_bias, p.dt_softplus, p.dt_limit)
    dt_max = dt_out.max(axis=(0, 2, 3))
    chunk_decay = dt_max * np.abs(p.A) * p.chunk_size
    assert np.all(chunk_decay <= 10.0 ** 1.25 * (1 + 1e-5))
    assert np.all(chunk_decay[dt_max > 0] >= 10.0 ** (0.25 - 0.5) * (1 - 1e-5))


@settings(max_examples=50, derandomize=True, database=None)
@given(spec=specs(shared_heads=True, segments=False, carried=True))
def test_shared_heads_specs_let_compute_out_take_several_heads(spec):
    """specs(shared_heads=True), as compute_out_alone draws it (no seq_idx, carried decays): two
    heads or more per group, chunks of two token blocks or more and two chunks or more, so its
    programs run over two heads wherever the count is even, in either layout."""
    assert spec.nheads // spec.ngroups >= 2 and spec.nheads % spec.ngroups == 0
    assert SHARED_HEADS_MIN_CHUNK <= spec.chunk_size < spec.seqlen and spec.segments == 1
    p = problem(spec)
    d = p.dims
    upstream = (np.empty(d.shape(n), np.float32) for n in ("dt_out", "dA_cumsum", "chunk_states"))
    choices = compute_out_choices(p.x, p.B, p.C, *upstream, p.D, p.z, None, p.x)
    assert any(c.heads == 2 for c in choices) == ((spec.nheads // spec.ngroups) % 2 == 0)


def test_specs_refuse_caps_that_hold_no_problem():
    @settings(max_examples=1, database=None)
    @given(spec=specs(dataclasses.replace(caps(), nheads=1), shared_heads=True))
    def draw(spec):
        pass
    with pytest.raises(ValueError, match="hold no problem with carried=False, shared_heads=True"):
        draw()


def test_compute_out_alone_refuses_to_check_nothing():
    """An occupancy hint outside the choices (a stale reproducer, say) leaves no choice to run:
    the property fails instead of passing on nothing."""
    p = problem(Spec(batch=1, seqlen=20, nheads=2, ngroups=1, headdim=4, dstate=4, chunk_size=16,
                     D=None, z=False, dt_mode="plain", dt_bias=False, dt_limit=(0.0, math.inf),
                     initial_states=False, segments=1, decay=0.0, decay_spread=0.0,
                     scales=(0.0, 0.0, 0.0), tails=0.0, seed=1))
    with pytest.raises(ValueError, match="no choice at occupancy 3"):
        compute_out_alone(p.replace(params={"occupancy": 3}), "interpreter")


def test_drifted_mutant_fails_loudly(tmp_path):
    m = mutants.CATALOGUE[0]
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text("nothing to mutate here\n")
    with pytest.raises(ValueError, match=m.name):
        mutants.apply(m, tmp_path)


def test_ci_profile_is_loaded_under_ci():
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    env["CI"] = "true"
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only",
                          "tests/test_properties.py", "-p", "no:cacheprovider"],
                         cwd=REPO, env=env, capture_output=True, text=True).stdout
    assert "hypothesis profile: ci (100 examples" in out, out[-2000:]


def test_reproducer_round_trip(tmp_path):
    spec = Spec(batch=2, seqlen=37, nheads=4, ngroups=2, headdim=5, dstate=3, chunk_size=16,
                D="channel", z=True, dt_mode="softplus", dt_bias=True, dt_limit=(1e-4, math.inf),
                initial_states=True, segments=3, decay=2.0, decay_spread=3.0,
                scales=(0.0, 1.0, -1.0), tails=1.0, seed=7, layout="projection",
                weights="activation", narrow_A=True)
    p = problem(spec).replace(params={"t": 5, "large": True, "seed": 3})
    p.save(tmp_path / "case.npz", "causal_prefix")
    name, q = Problem.load(tmp_path / "case.npz")
    assert name == "causal_prefix"
    for field in p.ARRAYS:
        np.testing.assert_array_equal(getattr(q, field), getattr(p, field))
        assert getattr(q, field).dtype == getattr(p, field).dtype
    assert (q.chunk_size, q.dt_softplus, q.dt_limit, q.params, q.spec) == \
        (p.chunk_size, p.dt_softplus, p.dt_limit, p.params, p.spec)
    assert (q.layout, q.weights, q.narrow_A) == ("projection", "activation", True)
    assert "layout=projection" in q.describe() and "weights=activation, A narrow" in q.describe()


@pytest.mark.slow
def test_every_mutant_is_killed(tmp_path):
    report = tmp_path / "report.txt"
    rc = mutants.main(["--report", str(report)])
    assert rc == 0, report.read_text()


def test_fuzzer_reproducer_of_planted_bug_replays(tmp_path):
    out = tmp_path / "fuzz"
    run = [sys.executable, "-m", "properties.fuzz", "--minutes", "0.5", "--backend",
           "interpreter", "--out", str(out), "--properties", "causal_prefix",
           "--mutant", "scan_causal_mask_off_by_one"]
    assert subprocess.run(run, cwd=REPO).returncode == 1
    summary = json.loads((out / "summary.json").read_text())
    command = summary["failures"]["causal_prefix"][0]["replay"].split()
    assert command[:3] == ["python", "-m", "properties.replay"]
    replay = [sys.executable, *command[1:]]
    assert subprocess.run(replay, cwd=REPO).returncode == 1  # the planted bug reproduces
    fixed = [a for a in replay if a not in ("--mutant", "scan_causal_mask_off_by_one")]
    assert subprocess.run(fixed, cwd=REPO).returncode == 0  # the real kernel passes it


def test_review_gate_runs_what_ci_runs(monkeypatch, capsys):
    """The gate's CPU steps: the compile gate, the kernels' own tests (each file exists), the
    property suite under the ci profile (its run ends with the reach check, conftest.py), the
    stored reproducers; a step that fails fails the gate."""
    from pathlib import Path
    from properties import gate
    calls = []

    def run(args, **env):
        calls.append((args, env))
        return 1 if "-m" in args and "compile" in args else 0
    monkeypatch.setattr(gate, "_run", run)
    assert gate.main(["--backend", "interpreter"]) == 1
    commands = [" ".join(args) for args, _ in calls]
    assert any("-m pytest -m compile" in c for c in commands)
    assert any(all(t in c for t in gate.KERNEL_TESTS) for c in commands)
    assert all((Path(gate.REPO) / t).is_file() for t in gate.KERNEL_TESTS)
    (properties_env,) = [env for args, env in calls if "properties" in args and "-m" in args]
    assert properties_env == {"HYPOTHESIS_PROFILE": "ci"}
    out = capsys.readouterr().out
    assert "GATE FAILED: compile gate" in out and "kernel tests over the named shapes" in out


def _bucket_of(spec: Spec) -> Bucket:
    return Bucket(batch=spec.batch, nheads=spec.nheads, ngroups=spec.ngroups,
                  headdim=spec.headdim, dstate=spec.dstate, chunk_size=spec.chunk_size, D=spec.D,
                  z=spec.z, dt_mode=spec.dt_mode, dt_bias=spec.dt_bias, dt_limit=spec.dt_limit,
                  initial_states=spec.initial_states, seq_idx=spec.segments > 1, wide=False,
                  layout=spec.layout, weights=spec.weights, narrow_A=spec.narrow_A,
                  route=spec.route, batch_parts=spec.batch_parts)


def test_bucketed_specs_repeat_their_sizes_and_options_but_not_the_rest():
    """specs(buckets=3): every example's sizes and options are one of 3 fixed buckets (the
    kernels' specializations repeat on the GPU), while seqlen and the values still vary."""
    drawn = []

    @settings(max_examples=60, derandomize=True, database=None)
    @given(spec=specs(buckets=3, segments=False))
    def collect(spec):
        drawn.append(spec)
    collect()
    # seq_idx is off here (segments=False), so a one-token example keeps its bucket
    buckets = {_bucket_of(s) for s in drawn}
    assert len(buckets) == 3, buckets
    assert len({s.seqlen for s in drawn}) > 5 and len({s.seed for s in drawn}) > 10
    assert max(b.headdim * b.dstate for b in buckets) > 1  # not only the simplest problems
    # the same buckets on every run (derandomized), computed afresh
    kwargs = dict(segments=False, gate=None, initial_states=None, carried=False,
                  shared_heads=False, wide=False)
    fresh = [_fixed_buckets.__wrapped__(caps(), 3, **kwargs) for _ in range(2)]
    assert fresh[0] == fresh[1] and set(fresh[0]) == buckets


def test_buckets_apply_on_the_gpu_backend_only(monkeypatch):
    monkeypatch.setenv(profiles.BACKEND_VARIABLE, "interpreter")
    assert profiles.buckets() == 0
    monkeypatch.setenv(profiles.BACKEND_VARIABLE, "gpu")
    assert profiles.buckets() == caps().gpu_buckets
    monkeypatch.setenv(profiles.BACKEND_VARIABLE, "tpu")
    with pytest.raises(ValueError, match=profiles.BACKEND_VARIABLE):
        profiles.buckets()
    assert profiles.CAPS["ci"].gpu_buckets > 0 and profiles.CAPS["nightly"].gpu_buckets == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_is_views_the_forward_reads_in_place(layout):
    """on_backend lays a problem's arrays out as its layout says: the same values, views of one
    larger array each (of one projection, for "projection": a view per dtype among them), with
    the strides the reach model's stand-ins take (strategies.layout_strides); the forward's
    launch plan copies none of them."""
    d = Dims(2, 21, 4, 6, 2, 5, 16)
    p = problem(spec_of(d, dict(D="channel", z=True, dt_bias=True, initial_states=True,
                                seq_idx=True, layout=layout)))
    arrays = on_backend(p, "interpreter")
    for name, a in arrays.items():
        np.testing.assert_array_equal(a, getattr(p, name))
        if name in LAID_OUT[layout]:
            assert a.base is not None and a.base.size > a.size, name
            if name != "seq_idx":  # the kernels read its segment ids
                assert tuple(s // a.itemsize for s in a.strides) == \
                    layout_strides(layout, d, name), name
        else:
            assert a.flags.c_contiguous, name
    if layout == "projection":
        assert all(arrays[n].base is arrays["x"].base for n in ("z", "B", "C", "dt"))
    options = dict(chunk_size=p.chunk_size, dt_softplus=p.dt_softplus, dt_limit=p.dt_limit)
    assert plan_of(Call(**arrays, **options)).copies == ()


def test_layouts_and_weights_shrink_to_contiguous_float32():
    """A failure that does not depend on them shrinks to C-contiguous arrays and float32
    weights."""
    shrunk = find(specs(), lambda spec: spec.seqlen > 3, settings=settings(database=None))
    assert (shrunk.layout, shrunk.weights, shrunk.narrow_A) == ("contiguous", "float32", False)
