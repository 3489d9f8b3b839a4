-- Messages mid-turn (docs/mid-turn.md): what a remembered send did, so that a send again
-- with the same message_id answers the same. outcome: started, queued, interrupted or
-- steered (NULL: remembered before this migration, when every send started or queued its
-- turn). interrupted: the turn an interrupting message cancelled. `number` is the turn
-- that answers the message (for a steered one, the turn it joined).
ALTER TABLE messages ADD COLUMN outcome TEXT;
ALTER TABLE messages ADD COLUMN interrupted INTEGER;
