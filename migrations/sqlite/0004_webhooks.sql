-- Webhooks (`notify`): as on Postgres (migrations/postgres/0006_webhooks.sql).
CREATE TABLE wait_notify (
    wait_id     BLOB    NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    endpoint    INTEGER NOT NULL,
    url         TEXT    NOT NULL,
    kinds       INTEGER NOT NULL,
    secret      TEXT    NOT NULL,
    stopped_at  INTEGER,
    PRIMARY KEY (wait_id, endpoint)
);

CREATE TABLE deliveries (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    wait_id          BLOB    NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    tenant           TEXT    NOT NULL,
    endpoint         INTEGER NOT NULL,
    seq              INTEGER NOT NULL,
    kind             TEXT    NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed', 'stopped')),
    created_at       INTEGER NOT NULL,
    next_attempt_at  INTEGER,
    finished_at      INTEGER,
    tries            INTEGER NOT NULL DEFAULT 0,
    attempts_total   INTEGER NOT NULL DEFAULT 0,
    attempts         TEXT    NOT NULL DEFAULT '[]',
    owner            BLOB,
    lease_until      INTEGER,
    epoch            INTEGER NOT NULL DEFAULT 0,
    UNIQUE (wait_id, endpoint, seq)
);
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status = 'pending';

CREATE TRIGGER wait_events_outbox AFTER INSERT ON wait_events
BEGIN
    INSERT INTO deliveries (wait_id, tenant, endpoint, seq, kind, created_at, next_attempt_at)
    SELECT NEW.wait_id, NEW.tenant, n.endpoint, NEW.seq, NEW.kind, NEW.at, NEW.at
    FROM wait_notify n
    WHERE n.wait_id = NEW.wait_id AND n.stopped_at IS NULL
      AND (n.kinds & CASE NEW.kind WHEN 'created' THEN 1 WHEN 'state' THEN 2 WHEN 'retry' THEN 4
                                   WHEN 'succeeded' THEN 8 WHEN 'failed' THEN 16 WHEN 'timed_out' THEN 32
                                   WHEN 'canceled' THEN 64 WHEN 'error' THEN 128 ELSE 0 END) <> 0;
END;
