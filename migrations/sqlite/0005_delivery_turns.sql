-- Claims by turns and the ordering rule: as on Postgres
-- (migrations/postgres/0009_delivery_turns.sql).
CREATE INDEX deliveries_pending_by_tenant ON deliveries (tenant, next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_pending_by_webhook ON deliveries (wait_id, endpoint, seq) WHERE status = 'pending';
