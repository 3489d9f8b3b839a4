"""The Client SDK: async first, with a thin sync wrapper."""

from dex.client.client import Client
from dex.client.sync import SyncClient

__all__ = ["Client", "SyncClient"]
