-- A running wait's progress (engine, polls, next_poll_at) is rewritten by every
-- checkpoint, once per wait every few minutes even when nothing changed. While
-- next_poll_at was indexed, each of those writes was a non-HOT update: a new entry
-- in every index of `waits`, and full-page images of their pages in the WAL. The
-- claim order now has a column of its own, `claim_at`, written only when a wait is
-- created, claimed or given back, so a checkpoint touches no indexed column and is
-- a HOT update (measured on 200,000 waits, a checkpoint statement per 1,000 rows:
-- 108 -> 38 us of Postgres time and 524 -> 183 WAL bytes a row).
--
-- For an unowned wait claim_at is its next poll. For an owned one it is its next
-- poll as of its claim: no later than the real one, so a replica that takes over a
-- lapsed replica's waits may claim them a little before they are due, never after.
ALTER TABLE waits ADD COLUMN claim_at timestamptz;
UPDATE waits SET claim_at = next_poll_at WHERE status = 'running';

DROP INDEX waits_unowned_due;
-- Claiming: due waits nobody holds (a lapsed replica's are found by `waits_owner`).
CREATE INDEX waits_unowned_due ON waits (claim_at) WHERE status = 'running' AND owner IS NULL;
