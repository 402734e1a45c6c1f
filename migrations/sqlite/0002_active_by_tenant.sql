-- The per-tenant limit on running waits counts them at every create.
CREATE INDEX waits_running_by_tenant ON waits (tenant) WHERE status = 'running';
