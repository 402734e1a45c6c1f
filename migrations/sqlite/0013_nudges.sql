-- Nudge URLs: a polled wait with "nudge": true gets a URL whose POST schedules
-- a poll now (docs/design.md §2.17). As for callback URLs, the secret is never
-- kept, only its SHA-256, so a copy of the database cannot nudge a wait.
--
-- secret_hash: SHA-256 of the URL's secret; unique, and how a nudge finds its wait.
CREATE TABLE wait_nudges (
    wait_id      BLOB  PRIMARY KEY REFERENCES waits (id) ON DELETE CASCADE,
    tenant       TEXT  NOT NULL,
    secret_hash  BLOB  NOT NULL UNIQUE
);
