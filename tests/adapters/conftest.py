"""Fixtures for the adapter tests: a real Dex Server in process (as for the providers)."""

from tests.models.conftest import dex_address

__all__ = ["dex_address"]
