-- Webhooks (`notify`): a wait's endpoints, and the outbox of deliveries.
--
-- wait_notify: one row per endpoint of a wait. `kinds` is the bit set of event
-- kinds it announces (created 1, state 2, retry 4, succeeded 8, failed 16,
-- timed_out 32, canceled 64, error 128); `secret` is the signing secret, sealed like
-- target header values; `stopped_at` is set when the receiver answered 410 Gone.
CREATE TABLE wait_notify (
    wait_id     uuid        NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    endpoint    integer     NOT NULL,           -- its index in the spec's notify list
    url         text        NOT NULL,
    kinds       integer     NOT NULL,
    secret      jsonb       NOT NULL,
    stopped_at  timestamptz,
    PRIMARY KEY (wait_id, endpoint)
);

-- One row per event and endpoint that announces it. Written by the trigger below in
-- the transaction that writes the event, so an event committed is a delivery owed.
-- A replica takes a delivery with a lease of its own (owner, lease_until, epoch:
-- fenced like waits); `tries` counts the attempts of the current round (the retry
-- schedule), `attempts` keeps the latest attempts for GET .../deliveries.
CREATE TABLE deliveries (
    id               bigserial   PRIMARY KEY,
    wait_id          uuid        NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    tenant           text        NOT NULL,
    endpoint         integer     NOT NULL,
    seq              integer     NOT NULL,
    kind             text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed', 'stopped')),
    created_at       timestamptz NOT NULL,
    next_attempt_at  timestamptz,
    finished_at      timestamptz,
    tries            integer     NOT NULL DEFAULT 0,
    attempts_total   integer     NOT NULL DEFAULT 0,
    attempts         jsonb       NOT NULL DEFAULT '[]',
    owner            uuid,
    lease_until      timestamptz,
    epoch            bigint      NOT NULL DEFAULT 0,
    UNIQUE (wait_id, endpoint, seq)
);
-- Claiming: pending deliveries, soonest first.
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status = 'pending';
-- Queue-like, as waits: vacuum early.
ALTER TABLE deliveries SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02, fillfactor = 80);

-- The outbox: every event statement adds the deliveries its events owe, in the same
-- transaction. One statement-level trigger per insert, so a batch of progress writes
-- costs one join, and a statement whose waits have no webhooks one empty one.
CREATE FUNCTION waitd_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO deliveries (wait_id, tenant, endpoint, seq, kind, created_at, next_attempt_at)
    SELECT e.wait_id, e.tenant, n.endpoint, e.seq, e.kind, e.at, e.at
    FROM new_events e JOIN wait_notify n ON n.wait_id = e.wait_id
    WHERE n.stopped_at IS NULL
      AND (n.kinds & CASE e.kind WHEN 'created' THEN 1 WHEN 'state' THEN 2 WHEN 'retry' THEN 4
                                 WHEN 'succeeded' THEN 8 WHEN 'failed' THEN 16 WHEN 'timed_out' THEN 32
                                 WHEN 'canceled' THEN 64 WHEN 'error' THEN 128 ELSE 0 END) <> 0
    -- Ids in event order, so that a wait's deliveries list in that order.
    ORDER BY e.seq, n.endpoint;
    RETURN NULL;
END
$$;
CREATE TRIGGER wait_events_outbox AFTER INSERT ON wait_events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION waitd_outbox();
