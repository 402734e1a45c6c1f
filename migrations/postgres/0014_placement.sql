-- Where a wait is held among the replicas: a number the same for every wait of one
-- tenant on one URL, which the claims honour so that those waits are held by one
-- replica and share their polls (docs/design.md §6.2). NULL (a group, or a wait
-- inserted before this column) is claimed by any replica.
ALTER TABLE waits ADD COLUMN placement bigint;
