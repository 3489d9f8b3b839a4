"""Partitions: how a cluster's sessions are shared out among its nodes.

A cluster on PostgreSQL has a fixed number of partitions, chosen when its database is
created (``DEFAULT_PARTITIONS``, or ``dex server --partitions N`` on the first start) and
stored in it (``dex_partitions``, one row each). A session belongs to the partition of a
stable hash of its id (``partition_of``: CRC-32, the same in every language and every
release), so any node, client or tool can tell which partition, and so which node,
holds a session without asking.

Each partition has its own owner and epoch: the node that holds the partition's lock
(``dex.server.ha.lease``) bumped the epoch on taking it, and every write batch it commits
checks the epochs of the partitions it touches (``dex_fence_partitions``). The embedded
SQLite node is one node with one partition, and checks nothing.
"""

from __future__ import annotations

import zlib

DEFAULT_PARTITIONS = 64
MAX_PARTITIONS = 4096
"""More partitions spread load more evenly, and cost a lock, a fence check and a little
recovery work each."""


def partition_of(session_id: str, count: int) -> int:
    """The partition of a session: its id's CRC-32 modulo ``count``."""
    return zlib.crc32(session_id.encode()) % count
