-- Groups: a wait that decides from other waits (`all` or `any` of them). The group
-- is a row of `waits` like any other (so reads, lists, cancels, events, streams and
-- webhooks serve it), with no next poll, so no claim ever takes it; these tables say
-- which waits it decides from and how.
CREATE TABLE wait_groups (
    group_id      uuid    PRIMARY KEY REFERENCES waits (id) ON DELETE CASCADE,
    mode          text    NOT NULL CHECK (mode IN ('all', 'any')),
    keep_running  boolean NOT NULL DEFAULT false
);

CREATE TABLE group_members (
    group_id   uuid    NOT NULL REFERENCES wait_groups (group_id) ON DELETE CASCADE,
    position   integer NOT NULL,
    member_id  uuid    NOT NULL REFERENCES waits (id) ON DELETE CASCADE,
    required   boolean NOT NULL DEFAULT true,
    PRIMARY KEY (group_id, position)
);
-- A member's end looks its groups up by this.
CREATE INDEX group_members_member ON group_members (member_id);
