"""Shared test configuration: Hypothesis profiles, and no process left behind.

``default`` keeps ``make verify`` quick; ``soak`` (``make soak``) runs many more
examples.  Select with ``HYPOTHESIS_PROFILE``.
"""

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from ring_ref import _fast
from tests.common.leftovers import become_subreaper, left_behind

settings.register_profile(
    "default",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "soak",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session", autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """Fail the session if a test left a process running (see ``tests/common/leftovers.py``)."""
    become_subreaper()
    yield
    left = left_behind()
    if left:
        pytest.fail("processes left behind by the tests:\n" + "\n".join(left), pytrace=False)


@pytest.fixture
def fresh_plans() -> Iterator[None]:
    """The fast engine's plans are cached per N: a test that uses this computes its own and leaves none
    patched (``pytestmark = pytest.mark.usefixtures("fresh_plans")``)."""
    _fast.plan.cache_clear()
    yield
    _fast.plan.cache_clear()
