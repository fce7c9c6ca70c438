"""Pytest set-up shared by every test: GPU detection, the backend option, markers, the reach
check of the property suite."""

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from kernels.arrays import gpu_available
from properties.profiles import (BACKEND_VARIABLE, buckets, caps, profile_name,
                                 register_profiles)

# Hypothesis profiles (properties/profiles.py): `dev` by default, `ci` where CI is set,
# $HYPOTHESIS_PROFILE to choose (`nightly` for the fuzz job). Loaded here, before any test
# module builds its strategies, so the size caps and the settings always agree.
register_profiles()
settings.load_profile(profile_name())


@pytest.fixture(autouse=True)
def unwritten_reads_fail():
    """In every test, a kernel on the interpreter that reads an element of an array the
    launchers allocated before any program wrote it fails, naming the kernel, the array, the
    index and the program (kernels.interpreter.track_writes)."""
    from kernels.interpreter import track_writes
    with track_writes():
        yield


@pytest.fixture
def nan_filled_outputs():
    """Every output the launchers allocate is NaN before a kernel writes it, so an element no
    program writes cannot pass a comparison (NaN fails every bound and every equality)."""
    from properties.runner import outputs_filled_with
    with outputs_filled_with(math.nan):
        yield


def pytest_addoption(parser):
    parser.addoption(
        "--backend", choices=("auto", "gpu", "interpreter"), default="auto",
        help="where kernels run in the property suite: the GPU, the CPU tile interpreter, "
             "or auto (GPU if one is present, else the interpreter)")


def _resolve_backend(config) -> str:
    choice = config.getoption("--backend")
    if choice == "auto":
        return "gpu" if gpu_available() else "interpreter"
    if choice == "gpu" and not gpu_available():
        pytest.exit("--backend gpu was asked for but no CUDA device is available", returncode=4)
    return choice


@pytest.fixture(scope="session")
def backend(request) -> str:
    """'gpu' or 'interpreter': the backend the kernels under test run on."""
    return _resolve_backend(request.config)


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none found)")
    for item in items:
        if item.get_closest_marker("gpu") or item.get_closest_marker("benchmark"):
            item.add_marker(skip)


def pytest_configure(config):
    # Hypothesis' own `--hypothesis-profile NAME` picks the matching size caps too
    name = config.getoption("hypothesis_profile", None)
    if name:
        os.environ["HYPOTHESIS_PROFILE"] = name
    # the strategies draw from buckets on the GPU (properties.profiles.buckets): they are built
    # when the test modules are imported, after this
    os.environ[BACKEND_VARIABLE] = _resolve_backend(config)


def pytest_report_header(config):
    return (f"hypothesis profile: {profile_name()} ({settings.default.max_examples} examples, "
            f"caps {caps()}, {buckets()} buckets per strategy)")


# --------------------------------------------------------------------------------------------
# The reach check (properties/reach.py): every launch of the property tests is recorded; where
# the whole suite ran under a profile that asks for it (Caps.reach: ci), a class of launch
# reachable at the caps that no property launched fails the run, and the table is printed. With
# pytest-xdist each worker writes its record into a folder the controller names, which merges
# them.

REACH_DIR = "CUTILE_SSD_REACH_DIR"


@pytest.fixture(scope="session")
def reach(request):
    """The session's record of launches (properties.reach.Record)."""
    return request.config._reach


def pytest_sessionstart(session):
    from properties.reach import Record
    session.config._reach = Record()
    if not hasattr(session.config, "workerinput"):  # not an xdist worker: the controller
        session.config._reach_dir = tempfile.mkdtemp(prefix="reach-")
        os.environ[REACH_DIR] = session.config._reach_dir


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    record = config._reach
    if hasattr(config, "workerinput"):
        if record.launched:
            out = Path(os.environ[REACH_DIR]) / f"{config.workerinput['workerid']}.json"
            out.write_text(json.dumps(record.as_dict()))
        return
    for path in Path(config._reach_dir).glob("*.json"):
        record.merge(json.loads(path.read_text()))
    shutil.rmtree(config._reach_dir, ignore_errors=True)
    config._reach_result = _reach_result(record)
    if config._reach_result and config._reach_result[0]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _reach_result(record):
    """(missing classes, table) where the whole suite ran under a reach profile, else None."""
    from properties.checks import PROPERTIES
    if not caps().reach or not set(PROPERTIES) <= record.properties():
        return None
    return record.check(caps())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    result = getattr(config, "_reach_result", None)
    if result is None:
        return
    missing, table = result
    terminalreporter.section("reach: classes of launch the property suite ran")
    terminalreporter.write_line(table)
    if missing:
        terminalreporter.write_line(
            f"reach FAILED: {len(missing)} class(es) reachable at the caps {caps()} were never "
            f"launched: " + "; ".join(missing), red=True)
    else:
        terminalreporter.write_line("reach: every class reachable at the caps was launched",
                                    green=True)
