-- Claims of a wait since a poll of it last completed (see the Postgres migration of
-- the same name): the claimer ends a wait once this passes a bound.
ALTER TABLE waits ADD COLUMN claims INTEGER NOT NULL DEFAULT 0;
