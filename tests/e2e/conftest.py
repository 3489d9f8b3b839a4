from tests.support.rig import rig, worker_language

__all__ = ["rig", "worker_language"]
