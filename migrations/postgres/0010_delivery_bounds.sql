-- Bounds on the outbox: pending deliveries per webhook, per wait and per tenant, and
-- one redelivery of a delivery per interval. A delivery the bounds take out of the
-- queue is `dropped`, with the bound that took it in `drop_reason`.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_status_check
    CHECK (status IN ('pending', 'delivered', 'failed', 'stopped', 'dropped'));
ALTER TABLE deliveries
    ADD COLUMN drop_reason    text CHECK (drop_reason IN ('webhook_cap', 'wait_cap', 'tenant_cap')),
    ADD COLUMN redelivered_at timestamptz;

-- The bounds, as the replicas were started with (each writes its settings at
-- start-up; the trigger below and redeliveries read them). One row.
CREATE TABLE delivery_limits (
    id                      integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    per_webhook             integer NOT NULL,
    per_wait                integer NOT NULL,
    per_tenant              integer NOT NULL,
    redelivery_interval_ms  bigint  NOT NULL
);
INSERT INTO delivery_limits (per_webhook, per_wait, per_tenant, redelivery_interval_ms)
VALUES (8, 16, 10000, 10000);

-- Deliveries dropped, by bound, for the metric. Sequences rather than a counter row:
-- a row would be locked by every statement that drops until it commits, and event
-- writes of every replica would queue on it exactly when they drop the most.
CREATE SEQUENCE deliveries_dropped_webhook_cap;
CREATE SEQUENCE deliveries_dropped_wait_cap;
CREATE SEQUENCE deliveries_dropped_tenant_cap;

-- The outbox, bounded. After the statement's deliveries are inserted, each bound is
-- applied in turn (webhook, wait, tenant) to the webhooks, waits and tenants the
-- statement touched: over a bound, the oldest pending deliveries that wait behind
-- an earlier one of their webhook go first, then the oldest first in line. A
-- delivery in flight (leased) is never dropped, nor one another transaction has
-- locked (SKIP LOCKED: an event write never waits on a claim or an outcome).
--
-- Every set of rows is named by an array (= ANY(ARRAY(...))), so each statement
-- reads the waits and tenants it touched by index, once, whatever the statistics
-- of a table that grew since it was last analyzed say.
CREATE OR REPLACE FUNCTION waitd_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    caps delivery_limits%ROWTYPE;
    waits_touched uuid[];
    over_tenants text[];
    over_by bigint[];
    dropped_now bigint;
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
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO caps FROM delivery_limits;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    waits_touched := ARRAY(SELECT DISTINCT wait_id FROM new_events);

    -- Per webhook of a wait: the first in line (in its retry schedule) and the newest.
    UPDATE deliveries d SET status = 'dropped', drop_reason = 'webhook_cap',
                            next_attempt_at = NULL, finished_at = now()
    FROM (SELECT q.id FROM deliveries q
          WHERE q.id = ANY(ARRAY(
                    SELECT r.id FROM (
                        SELECT p.id, p.leased,
                               count(*) OVER k - caps.per_webhook AS excess,
                               row_number() OVER (k ORDER BY p.leased, p.first, p.seq) AS nth
                        FROM (SELECT x.id, x.wait_id, x.endpoint, x.seq,
                                     (x.owner IS NOT NULL AND x.lease_until >= now()) AS leased,
                                     x.seq = min(x.seq) OVER (PARTITION BY x.wait_id, x.endpoint) AS first
                              FROM deliveries x
                              WHERE x.status = 'pending' AND x.wait_id = ANY(waits_touched)) p
                        WINDOW k AS (PARTITION BY p.wait_id, p.endpoint)) r
                    WHERE r.nth <= r.excess AND NOT r.leased))
            AND q.status = 'pending' AND (q.owner IS NULL OR q.lease_until < now())
          FOR UPDATE SKIP LOCKED) v
    WHERE d.id = v.id;
    GET DIAGNOSTICS dropped_now = ROW_COUNT;
    PERFORM nextval('deliveries_dropped_webhook_cap') FROM generate_series(1, dropped_now);

    -- Per wait, over its webhooks.
    UPDATE deliveries d SET status = 'dropped', drop_reason = 'wait_cap',
                            next_attempt_at = NULL, finished_at = now()
    FROM (SELECT q.id FROM deliveries q
          WHERE q.id = ANY(ARRAY(
                    SELECT r.id FROM (
                        SELECT p.id, p.leased,
                               count(*) OVER k - caps.per_wait AS excess,
                               row_number() OVER (k ORDER BY p.leased, p.first, p.id) AS nth
                        FROM (SELECT x.id, x.wait_id,
                                     (x.owner IS NOT NULL AND x.lease_until >= now()) AS leased,
                                     x.seq = min(x.seq) OVER (PARTITION BY x.wait_id, x.endpoint) AS first
                              FROM deliveries x
                              WHERE x.status = 'pending' AND x.wait_id = ANY(waits_touched)) p
                        WINDOW k AS (PARTITION BY p.wait_id)) r
                    WHERE r.nth <= r.excess AND NOT r.leased))
            AND q.status = 'pending' AND (q.owner IS NULL OR q.lease_until < now())
          FOR UPDATE SKIP LOCKED) v
    WHERE d.id = v.id;
    GET DIAGNOSTICS dropped_now = ROW_COUNT;
    PERFORM nextval('deliveries_dropped_wait_cap') FROM generate_series(1, dropped_now);

    -- Per tenant: a count of each tenant touched, and only one over its bound has its
    -- pending deliveries ranked.
    SELECT array_agg(c.tenant), array_agg(c.n - caps.per_tenant) INTO over_tenants, over_by
    FROM (SELECT x.tenant, count(*) AS n FROM deliveries x
          WHERE x.status = 'pending' AND x.tenant = ANY(ARRAY(SELECT DISTINCT tenant FROM new_events))
          GROUP BY x.tenant
          HAVING count(*) > caps.per_tenant) c;
    IF over_tenants IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE deliveries d SET status = 'dropped', drop_reason = 'tenant_cap',
                            next_attempt_at = NULL, finished_at = now()
    FROM (SELECT q.id FROM deliveries q
          WHERE q.id = ANY(ARRAY(
                    SELECT r.id FROM (
                        SELECT p.id, p.leased, o.excess,
                               row_number() OVER (PARTITION BY p.tenant ORDER BY p.leased, p.first, p.id) AS nth
                        FROM (SELECT x.id, x.tenant,
                                     (x.owner IS NOT NULL AND x.lease_until >= now()) AS leased,
                                     x.seq = min(x.seq) OVER (PARTITION BY x.wait_id, x.endpoint) AS first
                              FROM deliveries x
                              WHERE x.status = 'pending' AND x.tenant = ANY(over_tenants)) p
                        JOIN unnest(over_tenants, over_by) AS o(tenant, excess) ON o.tenant = p.tenant) r
                    WHERE r.nth <= r.excess AND NOT r.leased))
            AND q.status = 'pending' AND (q.owner IS NULL OR q.lease_until < now())
          FOR UPDATE SKIP LOCKED) v
    WHERE d.id = v.id;
    GET DIAGNOSTICS dropped_now = ROW_COUNT;
    PERFORM nextval('deliveries_dropped_tenant_cap') FROM generate_series(1, dropped_now);
    RETURN NULL;
END
$$;
