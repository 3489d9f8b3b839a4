-- Usage (docs/flow-control.md, Budgets): what each session's model calls used, written by
-- each transition beside the state (from its usage), for the session list. Sessions
-- stored before counted nothing: every one of them starts at zero.
ALTER TABLE sessions ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
