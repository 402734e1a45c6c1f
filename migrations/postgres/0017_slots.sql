-- Slots: a wait's `owner` names a slot, and a replica holds slots (docs/design.md
-- §6.2). A wait enters a slot when it is first claimed and stays in it; a replica
-- that takes over a dead replica's waits takes its slots (a few rows) and reads
-- their waits without writing them.
--
-- holder:      the replica holding the slot; NULL once released (a replica that
--              stopped gave it back).
-- gen:         one more at every change of holder; a holder's writes carry the gen
--              they hold it under, so a former holder's writes land nowhere.
-- claims:      times the slot was taken from a holder that died since its waits
--              were last all polled (the crash-loop guard, counted per slot).
-- released_at: when it was released.
CREATE TABLE slots (
    id          uuid        PRIMARY KEY,
    holder      uuid,
    gen         bigint      NOT NULL DEFAULT 0,
    claims      integer     NOT NULL DEFAULT 0,
    released_at timestamptz
);
CREATE INDEX slots_holder ON slots (holder);

-- Owners before this migration were replicas: each becomes a slot its replica holds.
INSERT INTO slots (id, holder)
SELECT DISTINCT owner, owner FROM waits WHERE owner IS NOT NULL AND status = 'running';
