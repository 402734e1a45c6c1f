-- Claims of a wait since a poll of it last completed: a wait whose poll takes the
-- replica polling it down (a crash, an abort, an OOM kill) is claimed again and
-- again by the next replica. The claimer ends it once this passes a bound.
ALTER TABLE waits ADD COLUMN claims integer NOT NULL DEFAULT 0;
