"""The Worker runtime: runs the Steps that the server hands it."""

from dex.worker.config import WorkerConfig
from dex.worker.worker import Worker

__all__ = ["Worker", "WorkerConfig"]
