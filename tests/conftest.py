"""Shared test configuration: Hypothesis profiles.

``default`` keeps ``make verify`` quick; ``soak`` (``make soak``) runs many more
examples.  Select with ``HYPOTHESIS_PROFILE``.
"""

import os

from hypothesis import HealthCheck, settings

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
