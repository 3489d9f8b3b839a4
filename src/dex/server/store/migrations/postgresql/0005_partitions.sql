-- The cluster (docs/cluster.md): the sessions are shared out among the nodes by
-- partition. A partition's row holds its epoch, bumped by each node that takes it (in
-- the transaction that holds the partition's fence lock exclusively: advisory key
-- (4612, id)); every write batch of a node calls dex_fence_partitions first, which holds
-- the fence lock of each partition the batch touches shared until the batch ends and
-- refuses the batch unless each epoch is still the one the node took. So a write to a
-- partition either commits before a takeover of that partition or is refused after it.
-- The number of partitions is chosen when the database is created: meta 'partitions',
-- written before this file runs by the node that creates the database (64 by default).
CREATE TABLE dex_partitions (
    id INTEGER PRIMARY KEY,
    epoch BIGINT NOT NULL DEFAULT 0,
    owner TEXT NOT NULL DEFAULT '',
    acquired_at TIMESTAMPTZ
);
INSERT INTO dex_partitions (id)
SELECT generate_series(0, coalesce((SELECT value::integer FROM meta WHERE key = 'partitions'), 64) - 1);

-- The nodes that ever joined: a node is live while it holds the advisory lock
-- (4610, key) on its lock connection (pg_locks tells, at once when a node dies).
CREATE TABLE dex_nodes (
    id TEXT COLLATE "C" PRIMARY KEY,
    key SERIAL UNIQUE,
    address TEXT NOT NULL,
    standby BOOLEAN NOT NULL,
    joined_at TIMESTAMPTZ NOT NULL
);

CREATE FUNCTION dex_fence_partitions(parts INTEGER[], epochs BIGINT[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    i INTEGER;
    current_epoch BIGINT;
BEGIN
    FOR i IN 1 .. coalesce(array_length(parts, 1), 0) LOOP
        PERFORM pg_advisory_xact_lock_shared(4612, parts[i]);
        SELECT epoch INTO current_epoch FROM dex_partitions WHERE id = parts[i];
        IF current_epoch IS DISTINCT FROM epochs[i] THEN
            RAISE EXCEPTION 'fenced: partition % has epoch %, this node writes with %',
                parts[i], current_epoch, epochs[i]
                USING ERRCODE = 'DXF01';
        END IF;
    END LOOP;
END
$$;
