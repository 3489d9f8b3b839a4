"""The Worker runtime: runs the Steps that the server hands it."""

from dex.worker.worker import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig"]
