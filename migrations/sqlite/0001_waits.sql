-- The embedded single-node store. Same tables as Postgres; timestamps are integer
-- milliseconds since the epoch, JSON is text, ids are 16-byte blobs (UUIDv7 sorts by
-- creation time either way).
CREATE TABLE waits (
    id            BLOB    PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'timed_out', 'canceled', 'error')),
    state         TEXT,
    reason        TEXT,
    error_detail  TEXT,
    last_error    TEXT,
    polls         INTEGER NOT NULL DEFAULT 0,
    retries       INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    deadline      INTEGER NOT NULL,
    next_poll_at  INTEGER,
    finished_at   INTEGER,
    labels        TEXT    NOT NULL DEFAULT '{}',
    engine        TEXT    NOT NULL,
    seq           INTEGER NOT NULL DEFAULT 0,
    owner         BLOB,
    lease_until   INTEGER,
    epoch         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX waits_due ON waits (next_poll_at) WHERE status = 'running';
CREATE INDEX waits_tenant_id ON waits (tenant, id DESC);
CREATE INDEX waits_owner ON waits (owner) WHERE owner IS NOT NULL;

CREATE TABLE wait_specs (
    wait_id  BLOB PRIMARY KEY REFERENCES waits (id) ON DELETE CASCADE,
    spec     TEXT NOT NULL,
    headers  TEXT NOT NULL
);

CREATE TABLE wait_events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    wait_id  BLOB    NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    seq      INTEGER NOT NULL,
    tenant   TEXT    NOT NULL,
    kind     TEXT    NOT NULL,
    at       INTEGER NOT NULL,
    data     TEXT    NOT NULL DEFAULT '{}',
    UNIQUE (wait_id, seq)
);
CREATE INDEX wait_events_tenant_id ON wait_events (tenant, id);

CREATE TABLE idempotency_keys (
    tenant        TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    request_hash  TEXT    NOT NULL,
    wait_id       BLOB    NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
);
