-- Bounds on the outbox: as on Postgres (migrations/postgres/0010_delivery_bounds.sql).
-- SQLite cannot change a CHECK constraint, so the table is made again; the outbox
-- trigger, which names it, goes first and comes back bounded.
DROP TRIGGER wait_events_outbox;

CREATE TABLE deliveries_bounded (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    wait_id          BLOB    NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    tenant           TEXT    NOT NULL,
    endpoint         INTEGER NOT NULL,
    seq              INTEGER NOT NULL,
    kind             TEXT    NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed', 'stopped', 'dropped')),
    created_at       INTEGER NOT NULL,
    next_attempt_at  INTEGER,
    finished_at      INTEGER,
    tries            INTEGER NOT NULL DEFAULT 0,
    attempts_total   INTEGER NOT NULL DEFAULT 0,
    attempts         TEXT    NOT NULL DEFAULT '[]',
    owner            BLOB,
    lease_until      INTEGER,
    epoch            INTEGER NOT NULL DEFAULT 0,
    drop_reason      TEXT    CHECK (drop_reason IN ('webhook_cap', 'wait_cap', 'tenant_cap')),
    redelivered_at   INTEGER,
    UNIQUE (wait_id, endpoint, seq)
);
INSERT INTO deliveries_bounded (id, wait_id, tenant, endpoint, seq, kind, status, created_at,
                                next_attempt_at, finished_at, tries, attempts_total, attempts,
                                owner, lease_until, epoch)
SELECT id, wait_id, tenant, endpoint, seq, kind, status, created_at, next_attempt_at,
       finished_at, tries, attempts_total, attempts, owner, lease_until, epoch
FROM deliveries;
DROP TABLE deliveries;
ALTER TABLE deliveries_bounded RENAME TO deliveries;
-- Its indexes, as 0004 and 0005 made them.
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_pending_by_tenant ON deliveries (tenant, next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_pending_by_webhook ON deliveries (wait_id, endpoint, seq) WHERE status = 'pending';

CREATE TABLE delivery_limits (
    id                      INTEGER PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    per_webhook             INTEGER NOT NULL,
    per_wait                INTEGER NOT NULL,
    per_tenant              INTEGER NOT NULL,
    redelivery_interval_ms  INTEGER NOT NULL
);
INSERT INTO delivery_limits (per_webhook, per_wait, per_tenant, redelivery_interval_ms)
VALUES (8, 16, 10000, 10000);

-- Deliveries dropped, by bound, for the metric (one writer: a counter row costs
-- nothing here).
CREATE TABLE deliveries_dropped (
    reason   TEXT    PRIMARY KEY,
    dropped  INTEGER NOT NULL DEFAULT 0
);
INSERT INTO deliveries_dropped (reason) VALUES ('webhook_cap'), ('wait_cap'), ('tenant_cap');

-- A row trigger: each event's deliveries, then the bounds in turn (webhook, wait,
-- tenant), as on Postgres. The event's time stands for now (it is written now).
CREATE TRIGGER wait_events_outbox AFTER INSERT ON wait_events
BEGIN
    INSERT INTO deliveries (wait_id, tenant, endpoint, seq, kind, created_at, next_attempt_at)
    SELECT NEW.wait_id, NEW.tenant, n.endpoint, NEW.seq, NEW.kind, NEW.at, NEW.at
    FROM wait_notify n
    WHERE n.wait_id = NEW.wait_id AND n.stopped_at IS NULL
      AND (n.kinds & CASE NEW.kind WHEN 'created' THEN 1 WHEN 'state' THEN 2 WHEN 'retry' THEN 4
                                   WHEN 'succeeded' THEN 8 WHEN 'failed' THEN 16 WHEN 'timed_out' THEN 32
                                   WHEN 'canceled' THEN 64 WHEN 'error' THEN 128 ELSE 0 END) <> 0;

    UPDATE deliveries SET status = 'dropped', drop_reason = 'webhook_cap',
                          next_attempt_at = NULL, finished_at = NEW.at
    WHERE id IN (SELECT r.id FROM (
              SELECT p.id, p.leased,
                     count(*) OVER k - (SELECT per_webhook FROM delivery_limits) AS excess,
                     row_number() OVER (k ORDER BY p.leased, p.first, p.seq) AS nth
              FROM (SELECT x.id, x.endpoint, x.seq,
                           (x.owner IS NOT NULL AND x.lease_until >= NEW.at) AS leased,
                           x.seq = min(x.seq) OVER (PARTITION BY x.endpoint) AS first
                    FROM deliveries x
                    WHERE x.wait_id = NEW.wait_id AND x.status = 'pending') p
              WINDOW k AS (PARTITION BY p.endpoint)) r
          WHERE r.nth <= r.excess AND NOT r.leased);
    UPDATE deliveries_dropped SET dropped = dropped + changes() WHERE reason = 'webhook_cap';

    UPDATE deliveries SET status = 'dropped', drop_reason = 'wait_cap',
                          next_attempt_at = NULL, finished_at = NEW.at
    WHERE id IN (SELECT r.id FROM (
              SELECT p.id, p.leased,
                     count(*) OVER () - (SELECT per_wait FROM delivery_limits) AS excess,
                     row_number() OVER (ORDER BY p.leased, p.first, p.id) AS nth
              FROM (SELECT x.id,
                           (x.owner IS NOT NULL AND x.lease_until >= NEW.at) AS leased,
                           x.seq = min(x.seq) OVER (PARTITION BY x.endpoint) AS first
                    FROM deliveries x
                    WHERE x.wait_id = NEW.wait_id AND x.status = 'pending') p) r
          WHERE r.nth <= r.excess AND NOT r.leased);
    UPDATE deliveries_dropped SET dropped = dropped + changes() WHERE reason = 'wait_cap';

    -- Only a tenant over its bound has its pending deliveries ranked.
    UPDATE deliveries SET status = 'dropped', drop_reason = 'tenant_cap',
                          next_attempt_at = NULL, finished_at = NEW.at
    WHERE id IN (SELECT r.id FROM (
              SELECT p.id, p.leased,
                     count(*) OVER () - (SELECT per_tenant FROM delivery_limits) AS excess,
                     row_number() OVER (ORDER BY p.leased, p.first, p.id) AS nth
              FROM (SELECT x.id,
                           (x.owner IS NOT NULL AND x.lease_until >= NEW.at) AS leased,
                           x.seq = min(x.seq) OVER (PARTITION BY x.wait_id, x.endpoint) AS first
                    FROM deliveries x
                    WHERE x.tenant = NEW.tenant AND x.status = 'pending'
                      AND (SELECT count(*) FROM deliveries c
                           WHERE c.tenant = NEW.tenant AND c.status = 'pending')
                          > (SELECT per_tenant FROM delivery_limits)) p) r
          WHERE r.nth <= r.excess AND NOT r.leased);
    UPDATE deliveries_dropped SET dropped = dropped + changes() WHERE reason = 'tenant_cap';
END;
