from tests.support.rig import rig

__all__ = ["rig"]
