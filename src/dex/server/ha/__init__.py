"""High availability on PostgreSQL: the lease that makes one node active, and its epoch."""

from dex.server.ha.lease import Lease, LeaseSettings

__all__ = ["Lease", "LeaseSettings"]
