-- A wait's output (docs/design.md §2.16): what it ended with, a callback's body or
-- the values its spec's `output` names; NULL while it runs and when it has none.
ALTER TABLE waits ADD COLUMN output jsonb;
