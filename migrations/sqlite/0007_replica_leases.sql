-- Leases belong to replicas, not rows, as on Postgres: a replica renews its one row
-- here, and the waits it owns are its while that lease runs. The store and the
-- worker then know one lease model whatever the backend.
CREATE TABLE replicas (
    id           BLOB    PRIMARY KEY,
    lease_until  INTEGER NOT NULL
);

-- Owners under the per-row scheme become replicas whose lease ends when their rows'
-- leases did.
INSERT INTO replicas (id, lease_until)
SELECT owner, COALESCE(max(lease_until), 0) FROM waits
WHERE owner IS NOT NULL AND status = 'running'
GROUP BY owner;
UPDATE waits SET lease_until = NULL WHERE lease_until IS NOT NULL;
