"""Shared test configuration: hypothesis profiles and the runtime fixture.

Profiles: ``dev`` (default) and ``ci`` (``--hypothesis-profile=ci``: derandomized so CI runs are
repeatable, no deadline because the machine is shared and noisy).
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# ``workers`` is a plain int, so sharing it between the examples of a @given test is safe
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=_SUPPRESS + [HealthCheck.data_too_large])
settings.register_profile("dev", deadline=None, print_blob=True, suppress_health_check=_SUPPRESS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(params=[1, 2], ids=lambda w: f"W{w}")
def workers(request) -> int:
    """Run the test once with one worker and once with two (the same tests on every runtime)."""
    return request.param
