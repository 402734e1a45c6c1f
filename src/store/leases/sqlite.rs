//! The worker's leases on SQLite: claiming waits, the replica's lease row, checkpoints
//! and releases, and forgetting replicas long gone.

use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use crate::bus::BusMsg;
use crate::store::sqlite::{SqliteDialect, ms};
use crate::store::{CheckpointRow, ClaimRow, StoreError, WaitEpoch};

impl SqliteDialect {
    /// Claims due waits that are unowned or owned by a replica whose lease has run
    /// out, giving `owner` a lease row first if it has none (never extending one:
    /// only renewals do), as on Postgres.
    pub(in crate::store) async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        let now = Utc::now();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO replicas (id, lease_until) VALUES (?, ?) ON CONFLICT (id) DO NOTHING",
        )
        .bind(owner)
        .bind(ms(now) + ttl.as_millis() as i64)
        .execute(&mut *tx)
        .await?;
        let rows = sqlx::query_as(
            "UPDATE waits SET owner = ?1, epoch = epoch + 1
             WHERE id IN (SELECT id FROM waits
                          WHERE status = 'running' AND next_poll_at <= ?2
                            AND (owner IS NULL
                                 OR owner IN (SELECT id FROM replicas WHERE lease_until <= ?3 AND id <> ?1))
                          ORDER BY next_poll_at LIMIT ?4)
             RETURNING id, epoch, claims, tenant, engine, next_poll_at, deadline,
                       (SELECT spec FROM wait_specs WHERE wait_id = waits.id) AS spec,
                       (SELECT headers FROM wait_specs WHERE wait_id = waits.id) AS headers,
                       (SELECT trace FROM wait_specs WHERE wait_id = waits.id) AS trace,
                       NULL AS slot, 0 AS slot_claims, 0 AS counted",
        )
        .bind(owner)
        .bind(ms(now) + lookahead.as_millis() as i64)
        .bind(ms(now))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// The replica's one lease row, extended (inserted if it has none).
    pub(in crate::store) async fn replicas_alive(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM replicas WHERE lease_until > ?")
                .bind(ms(Utc::now()))
                .fetch_one(&self.pool)
                .await?,
        )
    }

    pub(in crate::store) async fn renew_lease(
        &self,
        owner: Uuid,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, lease_until) VALUES (?, ?)
             ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until",
        )
        .bind(owner)
        .bind(ms(Utc::now()) + ttl.as_millis() as i64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Ends `owner`'s lease now.
    pub(in crate::store) async fn retire(&self, owner: Uuid) -> Result<(), StoreError> {
        sqlx::query("UPDATE replicas SET lease_until = ? WHERE id = ?")
            .bind(ms(Utc::now()))
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The checkpoints that carry a state (the others only name a wait).
    pub(in crate::store) async fn write_all_checkpoints(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<(), StoreError> {
        let dirty: Vec<&CheckpointRow> = held.iter().filter(|c| c.engine.is_some()).collect();
        self.write_checkpoints(owner, &dirty, false).await?;
        Ok(())
    }

    /// Every running wait `owner` owns, with its epoch.
    pub(in crate::store) async fn owned(&self, owner: Uuid) -> Result<Vec<WaitEpoch>, StoreError> {
        let rows: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT id, epoch FROM waits WHERE owner = ? AND status = 'running'")
                .bind(owner)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(WaitEpoch::from).collect())
    }

    pub(in crate::store) async fn release(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<u64, StoreError> {
        let all: Vec<&CheckpointRow> = held.iter().collect();
        let n = self.write_checkpoints(owner, &all, true).await?;
        self.bus.publish(BusMsg::Work);
        Ok(n)
    }

    /// One wait at a time inside one transaction (SQLite has no array parameters;
    /// one transaction is one disk sync all the same), fenced by owner and epoch;
    /// with `release`, the waits are given up too.
    async fn write_checkpoints(
        &self,
        owner: Uuid,
        held: &[&CheckpointRow],
        release: bool,
    ) -> Result<u64, StoreError> {
        if held.is_empty() {
            return Ok(0);
        }
        let now = Utc::now();
        let mut kept = 0;
        let mut tx = self.pool.begin().await?;
        for c in held {
            // A checkpoint lands only when it is newer (more polls) than the row.
            kept += sqlx::query(
                "UPDATE waits SET owner = CASE WHEN ?1 THEN NULL ELSE owner END,
                        engine = CASE WHEN ?3 > polls THEN ?2 ELSE engine END,
                        retries = CASE WHEN ?3 > polls THEN ?4 ELSE retries END,
                        next_poll_at = CASE WHEN ?3 > polls THEN ?5 ELSE next_poll_at END,
                        updated_at = CASE WHEN ?3 > polls THEN ?6 ELSE updated_at END,
                        claims = CASE WHEN ?3 > polls THEN 0 ELSE claims END,
                        polls = MAX(polls, COALESCE(?3, polls))
                 WHERE id = ?7 AND owner = ?8 AND epoch = ?9 AND status = 'running'",
            )
            .bind(release)
            .bind(&c.engine)
            .bind(c.polls)
            .bind(c.retries)
            .bind(c.next_poll_at.map(ms))
            .bind(ms(now))
            .bind(c.id)
            .bind(owner)
            .bind(c.epoch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        tx.commit().await?;
        Ok(kept)
    }

    /// Forgets replicas gone for a day that own nothing.
    pub(in crate::store) async fn maintain(&self) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM replicas WHERE lease_until < ?
               AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.owner = replicas.id AND w.status = 'running')",
        )
        .bind(ms(Utc::now()) - 24 * 3600 * 1000)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
