"""Pytest set-up shared by every test: GPU detection, the backend option, markers."""

import math
import os

import pytest
from hypothesis import settings

from kernels.arrays import gpu_available
from properties.profiles import caps, profile_name, register_profiles

# Hypothesis profiles (properties/profiles.py): `dev` by default, `ci` where CI is set,
# $HYPOTHESIS_PROFILE to choose (`nightly` for the fuzz job). Loaded here, before any test
# module builds its strategies, so the size caps and the settings always agree.
register_profiles()
settings.load_profile(profile_name())


@pytest.fixture
def nan_filled_outputs():
    """Every output the launchers allocate is NaN before a kernel writes it, so an element no
    program writes cannot pass a comparison (NaN fails every bound and every equality)."""
    from properties.checks import outputs_filled_with
    with outputs_filled_with(math.nan):
        yield


def pytest_addoption(parser):
    parser.addoption(
        "--backend", choices=("auto", "gpu", "interpreter"), default="auto",
        help="where kernels run in the property suite: the GPU, the CPU tile interpreter, "
             "or auto (GPU if one is present, else the interpreter)")


@pytest.fixture(scope="session")
def backend(request) -> str:
    """'gpu' or 'interpreter': the backend the kernels under test run on."""
    choice = request.config.getoption("--backend")
    if choice == "auto":
        return "gpu" if gpu_available() else "interpreter"
    if choice == "gpu" and not gpu_available():
        pytest.exit("--backend gpu was asked for but no CUDA device is available", returncode=4)
    return choice


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


def pytest_report_header(config):
    return (f"hypothesis profile: {profile_name()} ({settings.default.max_examples} examples, "
            f"caps {caps()})")

