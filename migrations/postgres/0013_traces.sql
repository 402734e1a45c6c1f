-- The trace a wait's polls and webhook attempts join: the `traceparent` of the
-- request that created it, when traces are exported (docs/design.md §6.11).
ALTER TABLE wait_specs ADD COLUMN trace text;
