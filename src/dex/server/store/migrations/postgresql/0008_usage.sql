-- Usage (docs/flow-control.md, Budgets): what each session's model calls used, written by
-- each transition beside the state (from its usage), for the session list. Sessions
-- stored before counted nothing: every one of them starts at zero. The same as SQLite's
-- 0006_usage.sql (BIGINT: SQLite's INTEGER holds 64 bits).
ALTER TABLE sessions ADD COLUMN input_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN output_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
