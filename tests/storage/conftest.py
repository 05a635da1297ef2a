"""Fixtures of the storage tests (helpers live in storage_helpers.py)."""
from storage_helpers import backend, tmp  # noqa: F401
