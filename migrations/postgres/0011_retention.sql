-- Retention: ended waits by when they ended, idempotency keys by their wait (so a
-- batch deletes by index), and per tenant the newest global event id deleted.
CREATE INDEX waits_ended ON waits (finished_at) WHERE status <> 'running';
CREATE INDEX idempotency_keys_wait ON idempotency_keys (wait_id);
CREATE TABLE retention_horizons (
    tenant        text    PRIMARY KEY,
    last_deleted  bigint  NOT NULL
);
