-- Groups: as on Postgres (migrations/postgres/0013_groups.sql).
CREATE TABLE wait_groups (
    group_id      BLOB    PRIMARY KEY REFERENCES waits (id) ON DELETE CASCADE,
    mode          TEXT    NOT NULL CHECK (mode IN ('all', 'any')),
    keep_running  INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE group_members (
    group_id   BLOB    NOT NULL REFERENCES wait_groups (group_id) ON DELETE CASCADE,
    position   INTEGER NOT NULL,
    member_id  BLOB    NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    required   INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (group_id, position)
);
CREATE INDEX group_members_member ON group_members (member_id);
