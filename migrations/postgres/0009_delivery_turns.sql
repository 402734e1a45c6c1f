-- Claims by turns (each tenant's due deliveries numbered soonest first) and the
-- ordering rule (a delivery goes once it is first in line for its webhook).

-- A tenant's pending deliveries, soonest first: the claim's turns, and the count of
-- a tenant's pending ones.
CREATE INDEX deliveries_pending_by_tenant ON deliveries (tenant, next_attempt_at) WHERE status = 'pending';
-- A webhook's pending deliveries in event order: which is first in line, in one
-- probe (the unique index would also walk past every delivery it ever finished).
CREATE INDEX deliveries_pending_by_webhook ON deliveries (wait_id, endpoint, seq) WHERE status = 'pending';
