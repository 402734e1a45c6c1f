-- Callback waits: a wait that ends when someone POSTs to its callback URL
-- (docs/design.md §2.15). The URL's secret is never kept, only its SHA-256, so a
-- copy of the database cannot complete a wait.
--
-- secret_hash: SHA-256 of the URL's secret; unique, and how a callback finds its wait.
-- heartbeat:   the spec's callback.heartbeat in milliseconds; NULL when it has none.
-- beat_at:     the wait's creation, then its latest heartbeat.
CREATE TABLE wait_callbacks (
    wait_id      uuid        PRIMARY KEY REFERENCES waits (id) ON DELETE CASCADE,
    tenant       text        NOT NULL,
    secret_hash  bytea       NOT NULL UNIQUE,
    heartbeat    bigint,
    beat_at      timestamptz NOT NULL
);
