-- Dex schema for SQLite, version 1.
CREATE TABLE agents (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX sessions_running ON sessions (status) WHERE status <> 'idle';

CREATE TABLE history (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE turns (
    session_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    status TEXT NOT NULL,
    turn TEXT NOT NULL,
    PRIMARY KEY (session_id, number)
);

CREATE TABLE messages (
    session_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    PRIMARY KEY (session_id, message_id)
);
