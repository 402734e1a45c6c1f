-- The global cursor of GET /events becomes `gid`, assigned after commit by one
-- sequencer at a time (instead of a lock that every event-writing transaction held
-- through its commit). A reader that has seen gid N never later finds a smaller one.
ALTER TABLE wait_events ADD COLUMN gid bigint;
UPDATE wait_events SET gid = id;
CREATE UNIQUE INDEX wait_events_gid ON wait_events (gid);
CREATE INDEX wait_events_unsequenced ON wait_events (id) WHERE gid IS NULL;
DROP INDEX wait_events_tenant_id;
CREATE INDEX wait_events_tenant_gid ON wait_events (tenant, gid);
