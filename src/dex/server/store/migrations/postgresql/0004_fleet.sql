-- The fleet view (GET /v1/sessions with filters, GET /v1/inbox): columns that each
-- transition writes beside the state, so that the session list filters and pages on
-- indexes. status gains 'waiting' (the turn waits for a person: an approval or an
-- answer) and 'failed' (no turn runs and the last one failed). The same as SQLite's
-- 0003_fleet.sql.
ALTER TABLE sessions ADD COLUMN updated_at DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN waiting_since DOUBLE PRECISION;
ALTER TABLE sessions ADD COLUMN outcome_unknown INTEGER NOT NULL DEFAULT 0;

-- Sessions stored before: their state gets the fields this version keeps (the latest
-- ended turn's status, the outcome_unknown calls of ended turns), and the columns are
-- read from the state and the turns. A record of format 1 holds its Steps and calls
-- inside it, one of format 2 in the steps and calls tables, as the reader takes them.
-- PostgreSQL's JSON functions refuse a \u0000 anywhere in a document, so they read a
-- copy with each one replaced (only fields that never hold one are read), and the new
-- fields are appended to the state's own text, which keeps every byte of it.
CREATE FUNCTION pg_temp.dex_json(doc TEXT) RETURNS json LANGUAGE sql IMMUTABLE AS
    $$ SELECT replace(doc, '\u0000', '\ufffd')::json $$;
CREATE FUNCTION pg_temp.dex_format(doc TEXT) RETURNS integer LANGUAGE sql IMMUTABLE AS
    $$ SELECT coalesce((pg_temp.dex_json(doc) ->> 'format')::integer, 1) $$;
UPDATE sessions SET
    updated_at = created_at,
    state = left(rtrim(state), -1)
        || ',"updated_at":' || created_at::text
        || ',"last_turn_status":' || coalesce((
            SELECT to_json(t.status)::text FROM turns t WHERE t.session_id = sessions.id
            ORDER BY t.number DESC LIMIT 1
        ), 'null')
        || ',"unknown_ended":' || ((
            SELECT count(*)
            FROM turns t, json_array_elements(pg_temp.dex_json(t.turn) -> 'tool_calls') c
            WHERE t.session_id = sessions.id AND pg_temp.dex_format(t.turn) < 2
              AND c ->> 'status' = 'outcome_unknown'
        ) + (
            SELECT count(*) FROM turns t JOIN calls c
                ON c.session_id = t.session_id AND c.turn = t.number
            WHERE t.session_id = sessions.id AND pg_temp.dex_format(t.turn) >= 2
              AND pg_temp.dex_json(c.call) ->> 'status' = 'outcome_unknown'
        ))::text
        || '}';
UPDATE sessions SET
    outcome_unknown = (pg_temp.dex_json(state) ->> 'unknown_ended')::integer + CASE
        WHEN pg_temp.dex_format(state) < 2 THEN (
            SELECT count(*)
            FROM json_array_elements(pg_temp.dex_json(state) -> 'turn' -> 'tool_calls') c
            WHERE c ->> 'status' = 'outcome_unknown'
        )
        ELSE (
            SELECT count(*) FROM calls c
            WHERE c.session_id = sessions.id AND c.turn = sessions.turn
              AND pg_temp.dex_json(c.call) ->> 'status' = 'outcome_unknown'
        )
    END,
    waiting_since = (
        SELECT min((s -> 'wait' ->> 'since')::double precision)
        FROM (
            SELECT s FROM json_array_elements(pg_temp.dex_json(state) -> 'turn' -> 'steps') s
            WHERE pg_temp.dex_format(state) < 2
            UNION ALL
            SELECT pg_temp.dex_json(r.step) FROM steps r
            WHERE r.session_id = sessions.id AND r.turn = sessions.turn
              AND pg_temp.dex_format(state) >= 2
        ) AS found (s)
        WHERE s ->> 'status' = 'waiting'
          AND s ->> 'type' IN ('AwaitToolApproval', 'AwaitQuestionAnswer')
          AND NOT EXISTS (
              SELECT 1 FROM json_array_elements(pg_temp.dex_json(state) -> 'inbox') e
              WHERE e ->> 'step_id' = s ->> 'id'
          )
    );
UPDATE sessions SET status = 'waiting' WHERE waiting_since IS NOT NULL;
UPDATE sessions SET status = 'failed'
    WHERE status = 'idle' AND pg_temp.dex_json(state) ->> 'last_turn_status' = 'failed';
DROP FUNCTION pg_temp.dex_format(TEXT);
DROP FUNCTION pg_temp.dex_json(TEXT);

-- Each filter of the list alone, in either order (newest created or updated first),
-- reads one range of one index: a page costs the same at any number of sessions.
-- sessions_status_updated also finds the sessions in a turn (running, waiting) on start.
DROP INDEX sessions_running;
CREATE INDEX sessions_created ON sessions (created_at, id);
CREATE INDEX sessions_updated ON sessions (updated_at, id);
CREATE INDEX sessions_agent ON sessions (agent, created_at, id);
CREATE INDEX sessions_status ON sessions (status, created_at, id);
CREATE INDEX sessions_status_updated ON sessions (status, updated_at, id);
CREATE INDEX sessions_unknown ON sessions (created_at, id) WHERE outcome_unknown > 0;
CREATE INDEX sessions_waiting ON sessions (waiting_since, id) WHERE waiting_since IS NOT NULL;
