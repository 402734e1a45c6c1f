-- A lapsed replica's waits are claimed in `claim_at` order, a batch at a time.
-- With `waits_owner` on `owner` alone, each batch read every remaining wait of
-- the dead replica and sorted them (a seq scan and an external sort: 280-350 ms
-- a batch of 1,000 at 500,000 waits, growing as the takeover went on). Ordered
-- by `claim_at` within the owner, a batch reads only the rows it takes (65-75 ms
-- a batch, the row updates themselves, whatever is left). It replaces the old
-- index, so a claim still writes one entry here; `claim_at` is written only when
-- `owner` is, so checkpoints stay HOT updates.
DROP INDEX waits_owner;
CREATE INDEX waits_owner ON waits (owner, claim_at) WHERE owner IS NOT NULL;
