-- Each Step and tool call of a turn in a row of its own, so a transition writes the
-- ones it changed instead of the whole turn, and ``sessions.turn`` names the current turn
-- (NULL when idle), whose rows a load reads with the session's state.
ALTER TABLE sessions ADD COLUMN turn INTEGER;

CREATE TABLE steps (
    session_id TEXT COLLATE "C" NOT NULL,
    turn INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    step TEXT NOT NULL,
    PRIMARY KEY (session_id, turn, seq)
);

CREATE TABLE calls (
    session_id TEXT COLLATE "C" NOT NULL,
    turn INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    call TEXT NOT NULL,
    PRIMARY KEY (session_id, turn, seq)
);
