-- Event sources (docs/design.md §2.18): a tenant's named receivers of signed
-- webhooks, the events they keep for a lookback window, and the index of waits
-- listening for a key. Times are milliseconds since the epoch, as on SQLite, so
-- that window arithmetic is the same statement on both.
--
-- event_sources.id: the random, unguessable id in the hook URL (/hooks/{id}).
-- event_sources.secret: the signing secret, sealed as target header values are
--   (store/secrets.rs); never shown.
-- event_sources.key_from: how an event's key is read: a JSON Pointer into its body
--   (starts with "/") or a CEL expression over its body and headers.
CREATE TABLE event_sources (
    id           TEXT    PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    key_from     TEXT    NOT NULL,
    lookback_ms  INTEGER  NOT NULL,
    secret       TEXT    NOT NULL,
    created_ms   INTEGER  NOT NULL,
    UNIQUE (tenant, name)
);

-- An event a source accepted, kept until expires_ms (received_ms plus the
-- source's lookback): a wait created later with its key still sees it, and a
-- replay of its delivery id meanwhile is one effect.
CREATE TABLE source_events (
    source_id    TEXT    NOT NULL REFERENCES event_sources (id) ON DELETE CASCADE,
    delivery     TEXT    NOT NULL,
    tenant       TEXT    NOT NULL,
    key          TEXT,
    body         TEXT    NOT NULL,
    headers      TEXT    NOT NULL,
    bytes        INTEGER  NOT NULL,
    received_ms  INTEGER  NOT NULL,
    expires_ms   INTEGER  NOT NULL,
    PRIMARY KEY (source_id, delivery)
);
CREATE INDEX source_events_by_key ON source_events (source_id, key, received_ms);
CREATE INDEX source_events_by_tenant ON source_events (tenant, expires_ms);
CREATE INDEX source_events_by_expiry ON source_events (expires_ms);

-- The waits listening to a source for a key: an event finds its candidates here,
-- in proportion to how many there are, not to how many waits exist.
CREATE TABLE wait_listeners (
    source_id  TEXT  NOT NULL REFERENCES event_sources (id) ON DELETE CASCADE,
    key        TEXT  NOT NULL,
    wait_id    BLOB  NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    PRIMARY KEY (source_id, key, wait_id)
);
CREATE INDEX wait_listeners_by_wait ON wait_listeners (wait_id);
