-- The lease epoch and the fence (DESIGN §7). Each new leader bumps ``epoch`` in the
-- transaction that holds the fence lock (advisory key 4601000002) exclusively; every
-- write batch of a node with an epoch calls dex_fence(epoch) first, which holds the
-- same lock shared until the batch ends and refuses the batch unless the epoch is
-- still current. So a write either commits before a takeover or is refused after it.
CREATE TABLE dex_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL
);
INSERT INTO dex_lease (id, epoch, holder, acquired_at) VALUES (1, 0, '', now());

CREATE FUNCTION dex_fence(expected BIGINT) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    current_epoch BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(4601000002);
    SELECT epoch INTO current_epoch FROM dex_lease WHERE id = 1;
    IF current_epoch IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'fenced: the lease epoch is %, this node writes with %',
            current_epoch, expected
            USING ERRCODE = 'DXF01';
    END IF;
END
$$;
