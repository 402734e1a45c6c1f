-- waits: one row per wait. The hot columns the worker pool touches (status,
-- next_poll_at, owner, lease_until, epoch, engine) stay narrow; the spec lives in
-- wait_specs so that claiming and renewing never rewrite it.
CREATE TABLE waits (
    id            uuid        PRIMARY KEY,           -- UUIDv7: sorts by creation time
    tenant        text        NOT NULL,
    status        text        NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'timed_out', 'canceled', 'error')),
    state         text,
    reason        text,
    error_detail  jsonb,
    last_error    text,
    polls         integer     NOT NULL DEFAULT 0,
    retries       integer     NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    deadline      timestamptz NOT NULL,
    next_poll_at  timestamptz,
    finished_at   timestamptz,
    labels        jsonb       NOT NULL DEFAULT '{}',
    engine        jsonb       NOT NULL,              -- the engine's checkpoint
    seq           integer     NOT NULL DEFAULT 0,    -- last event seq of this wait
    owner         uuid,                              -- replica holding the lease
    lease_until   timestamptz,
    epoch         bigint      NOT NULL DEFAULT 0     -- fencing token, +1 per claim
);

-- Queue-like: rows are updated often while running and then left alone; vacuum
-- early so claims do not wade through dead tuples.
ALTER TABLE waits SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02, fillfactor = 80);

-- Claiming: due running waits, oldest first.
CREATE INDEX waits_due ON waits (next_poll_at) WHERE status = 'running';
-- Listing: a tenant's waits newest first (UUIDv7 order).
CREATE INDEX waits_tenant_id ON waits (tenant, id DESC);
-- Renewal and release: a replica's own waits.
CREATE INDEX waits_owner ON waits (owner) WHERE owner IS NOT NULL;

CREATE TABLE wait_specs (
    wait_id  uuid  PRIMARY KEY REFERENCES waits (id) ON DELETE CASCADE,
    spec     jsonb NOT NULL,   -- the normalised spec, header values already redacted
    headers  jsonb NOT NULL    -- target header values (secrets), kept apart
);

-- Append-only history. seq orders one wait's events; id is the global cursor of
-- GET /events, assigned under a transaction lock so that ids become visible in order.
CREATE TABLE wait_events (
    id       bigserial   PRIMARY KEY,
    wait_id  uuid        NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    seq      integer     NOT NULL,
    tenant   text        NOT NULL,
    kind     text        NOT NULL,
    at       timestamptz NOT NULL,
    data     jsonb       NOT NULL DEFAULT '{}',
    UNIQUE (wait_id, seq)
);
CREATE INDEX wait_events_tenant_id ON wait_events (tenant, id);

CREATE TABLE idempotency_keys (
    tenant        text        NOT NULL,
    key           text        NOT NULL,
    request_hash  text        NOT NULL,
    wait_id       uuid        NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant, key)
);
