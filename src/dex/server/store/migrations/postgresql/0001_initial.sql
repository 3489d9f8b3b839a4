-- Dex schema for PostgreSQL, version 1: the SQLite schema's tables, with text keys in
-- byte order (COLLATE "C") so that ids sort as they do on SQLite.
CREATE TABLE agents (
    name TEXT COLLATE "C" PRIMARY KEY,
    spec TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE sessions (
    id TEXT COLLATE "C" PRIMARY KEY,
    agent TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX sessions_running ON sessions (status) WHERE status <> 'idle';

CREATE TABLE history (
    session_id TEXT COLLATE "C" NOT NULL,
    seq INTEGER NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE turns (
    session_id TEXT COLLATE "C" NOT NULL,
    number INTEGER NOT NULL,
    status TEXT NOT NULL,
    turn TEXT NOT NULL,
    PRIMARY KEY (session_id, number)
);

CREATE TABLE messages (
    session_id TEXT COLLATE "C" NOT NULL,
    message_id TEXT COLLATE "C" NOT NULL,
    number INTEGER NOT NULL,
    PRIMARY KEY (session_id, message_id)
);
