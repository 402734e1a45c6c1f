-- A wait's output (docs/design.md §2.16): what it ended with, a callback's body or
-- the values its spec's `output` names; NULL while it runs and when it has none.
ALTER TABLE waits ADD COLUMN output jsonb;

-- Whether a callback wait's spec judges a callback's body (a state path or a
-- condition): a completion of one that does not ends it without reading its spec.
ALTER TABLE wait_callbacks ADD COLUMN judged boolean NOT NULL DEFAULT false;
