import os

import pytest
from hypothesis import HealthCheck, settings

from native_helpers import OFF as NATIVE_OFF, check_native_marks

# Property tests: no per-example deadline (torch's first calls are slow); a CI profile with
# fewer examples keeps the suite well inside its time, GATHERLENS_HYPOTHESIS=thorough for more.
settings.register_profile(
    "default", deadline=None, max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", deadline=None, max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("GATHERLENS_HYPOTHESIS", "default"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Lanes: every browser test runs in the slow lane (`pytest -m "not slow"` is the fast one)."""
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_setup(item):
    """A native kernel that did not build fails its tests (skips them only under GATHERLENS_NATIVE=0)."""
    check_native_marks(item)


def pytest_report_header(config):
    return ("native kernels: off (GATHERLENS_NATIVE=0): their tests are skipped" if NATIVE_OFF else
            "native kernels: on: a kernel that does not build fails its tests (GATHERLENS_NATIVE=0 skips them)")
