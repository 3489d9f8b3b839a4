-- The fleet view (GET /v1/sessions with filters, GET /v1/inbox): columns that each
-- transition writes beside the state, so that the session list filters and pages on
-- indexes. status gains 'waiting' (the turn waits for a person: an approval or an
-- answer) and 'failed' (no turn runs and the last one failed).
ALTER TABLE sessions ADD COLUMN updated_at DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN waiting_since DOUBLE PRECISION;
ALTER TABLE sessions ADD COLUMN outcome_unknown INTEGER NOT NULL DEFAULT 0;

-- Sessions stored before: their state gets the fields this version keeps (the latest
-- ended turn's status, the outcome_unknown calls of ended turns), and the columns are
-- read from the state and the turns. A record of format 1 holds its Steps and calls
-- inside it, one of format 2 in the steps and calls tables, as the reader takes them.
UPDATE sessions SET
    updated_at = created_at,
    state = json_set(
        state,
        '$.updated_at', created_at,
        '$.last_turn_status', (
            SELECT t.status FROM turns t WHERE t.session_id = sessions.id
            ORDER BY t.number DESC LIMIT 1
        ),
        '$.unknown_ended', (
            SELECT count(*) FROM turns t, json_each(t.turn, '$.tool_calls') c
            WHERE t.session_id = sessions.id
              AND coalesce(json_extract(t.turn, '$.format'), 1) < 2
              AND json_extract(c.value, '$.status') = 'outcome_unknown'
        ) + (
            SELECT count(*) FROM turns t JOIN calls c
                ON c.session_id = t.session_id AND c.turn = t.number
            WHERE t.session_id = sessions.id
              AND json_extract(t.turn, '$.format') >= 2
              AND json_extract(c.call, '$.status') = 'outcome_unknown'
        )
    );
UPDATE sessions SET
    outcome_unknown = json_extract(state, '$.unknown_ended') + CASE
        WHEN coalesce(json_extract(state, '$.format'), 1) < 2 THEN (
            SELECT count(*) FROM json_each(sessions.state, '$.turn.tool_calls') c
            WHERE json_extract(c.value, '$.status') = 'outcome_unknown'
        )
        ELSE (
            SELECT count(*) FROM calls c
            WHERE c.session_id = sessions.id AND c.turn = sessions.turn
              AND json_extract(c.call, '$.status') = 'outcome_unknown'
        )
    END,
    waiting_since = CASE
        WHEN coalesce(json_extract(state, '$.format'), 1) < 2 THEN (
            SELECT min(json_extract(s.value, '$.wait.since'))
            FROM json_each(sessions.state, '$.turn.steps') s
            WHERE json_extract(s.value, '$.status') = 'waiting'
              AND json_extract(s.value, '$.type') IN ('AwaitToolApproval', 'AwaitQuestionAnswer')
              AND NOT EXISTS (
                  SELECT 1 FROM json_each(sessions.state, '$.inbox') e
                  WHERE json_extract(e.value, '$.step_id') = json_extract(s.value, '$.id')
              )
        )
        ELSE (
            SELECT min(json_extract(s.step, '$.wait.since'))
            FROM steps s
            WHERE s.session_id = sessions.id AND s.turn = sessions.turn
              AND json_extract(s.step, '$.status') = 'waiting'
              AND json_extract(s.step, '$.type') IN ('AwaitToolApproval', 'AwaitQuestionAnswer')
              AND NOT EXISTS (
                  SELECT 1 FROM json_each(sessions.state, '$.inbox') e
                  WHERE json_extract(e.value, '$.step_id') = json_extract(s.step, '$.id')
              )
        )
    END;
UPDATE sessions SET status = 'waiting' WHERE waiting_since IS NOT NULL;
UPDATE sessions SET status = 'failed'
    WHERE status = 'idle' AND json_extract(state, '$.last_turn_status') = 'failed';

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
