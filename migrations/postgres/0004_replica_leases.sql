-- Leases belong to replicas, not rows: a replica renews its one row in `replicas`,
-- and the waits it owns are its while that lease runs. Lease upkeep is one row per
-- replica instead of one row per held wait.
CREATE TABLE replicas (
    id           uuid        PRIMARY KEY,
    lease_until  timestamptz NOT NULL
);

-- Owners under the previous scheme become replicas whose lease ends when their
-- rows' leases did.
INSERT INTO replicas (id, lease_until)
SELECT owner, COALESCE(max(lease_until), now()) FROM waits
WHERE owner IS NOT NULL AND status = 'running'
GROUP BY owner;
UPDATE waits SET lease_until = NULL WHERE lease_until IS NOT NULL;

-- A claim takes unowned due waits by this index, and waits of replicas whose lease
-- ran out by `waits_owner`.
CREATE INDEX waits_unowned_due ON waits (next_poll_at) WHERE status = 'running' AND owner IS NULL;
DROP INDEX waits_due;
