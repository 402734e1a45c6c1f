//! Groups on Postgres: SQL only (see [`super`]).

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{GroupHead, GroupWrite, LinkRow, NewGroup};
use crate::store::columns::Json;
use crate::store::postgres::PgDialect;
use crate::store::{Admission, Inserted, StoreError};

impl PgDialect {
    /// The group's row, its spec, its `created` event, its webhooks, its mode and
    /// its members, in one transaction; false when the idempotency key was taken.
    pub(super) async fn insert_group(
        &self,
        tenant: &str,
        now: DateTime<Utc>,
        g: &NewGroup<'_>,
        idempotency: Option<(&str, &str)>,
        admission: Admission,
    ) -> Result<Inserted, StoreError> {
        let nw = g.wait;
        let mut tx = self.pool.begin().await?;
        // The group is a running wait of the tenant's, counted as any other.
        let counted = match crate::store::waits::postgres::admit(&mut tx, tenant, admission).await?
        {
            Ok(counted) => counted,
            Err(n) => return Ok(Inserted::Full(n)),
        };
        sqlx::query(
            "INSERT INTO waits (id, tenant, status, state, created_at, updated_at, deadline, next_poll_at, claim_at, labels, engine, seq)
             VALUES ($1, $2, 'running', $3, $4, $4, $5, NULL, NULL, $6, $7, 1)",
        )
        .bind(nw.id)
        .bind(tenant)
        .bind(&g.state)
        .bind(now)
        .bind(nw.engine.deadline)
        .bind(&nw.labels)
        .bind(&nw.engine_json)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO wait_specs (wait_id, spec, headers, trace) VALUES ($1, $2, $3, $4)",
        )
        .bind(nw.id)
        .bind(&nw.spec)
        .bind(&nw.headers)
        .bind(&nw.trace)
        .execute(&mut *tx)
        .await?;
        if let Some((key, hash)) = idempotency
            && !crate::store::waits::postgres::take_key(&mut tx, tenant, key, hash, nw.id, now)
                .await?
        {
            tx.rollback().await?;
            return Ok(Inserted::KeyTaken);
        }
        for n in &nw.notify {
            sqlx::query(
                "INSERT INTO wait_notify (wait_id, endpoint, url, kinds, secret) VALUES ($1, $2, $3, $4, $5::jsonb)",
            )
            .bind(nw.id)
            .bind(n.endpoint)
            .bind(&n.url)
            .bind(n.kinds)
            .bind(n.secret.to_string())
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data) VALUES ($1, 1, $2, $3, $4, $5)",
        )
        .bind(nw.id)
        .bind(tenant)
        .bind(nw.created.0)
        .bind(now)
        .bind(&nw.created.1)
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO wait_groups (group_id, mode, keep_running) VALUES ($1, $2, $3)")
            .bind(nw.id)
            .bind(g.mode)
            .bind(g.keep_running)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO group_members (group_id, position, member_id, required)
             SELECT $1, p::int - 1, m, r FROM unnest($2::uuid[], $3::bool[]) WITH ORDINALITY AS t(m, r, p)",
        )
        .bind(nw.id)
        .bind(g.members.iter().map(|m| m.0).collect::<Vec<Uuid>>())
        .bind(g.members.iter().map(|m| m.1).collect::<Vec<bool>>())
        .execute(&mut *tx)
        .await?;
        if !g.by_id.is_empty() {
            // The group's deadline caps its members': a claim takes the earlier of
            // this column and the engine's own (and the next poll is no later).
            sqlx::query(
                "UPDATE waits SET deadline = LEAST(deadline, $2),
                        next_poll_at = LEAST(next_poll_at, $2), claim_at = LEAST(claim_at, $2)
                 WHERE id = ANY($1) AND status = 'running' AND deadline > $2",
            )
            .bind(&g.by_id)
            .bind(nw.engine.deadline)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.committed.notify_one();
        Ok(Inserted::Yes { counted })
    }

    pub(super) async fn group_links(&self, ids: &[Uuid]) -> Result<Vec<LinkRow>, StoreError> {
        let rows = sqlx::query_as(
            "SELECT m.group_id, g.mode, m.position, m.member_id, m.required, x.status, x.deadline
             FROM group_members m
             JOIN wait_groups g ON g.group_id = m.group_id
             JOIN waits x ON x.id = m.member_id
             WHERE m.group_id = ANY($1) OR m.member_id = ANY($1)",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// The outputs of those of `ids` that ended with one.
    pub(super) async fn outputs(&self, ids: &[Uuid]) -> Result<Vec<(Uuid, Json)>, StoreError> {
        Ok(
            sqlx::query_as(
                "SELECT id, output FROM waits WHERE id = ANY($1) AND output IS NOT NULL",
            )
            .bind(ids)
            .fetch_all(&self.pool)
            .await?,
        )
    }

    pub(super) async fn group_head(&self, id: Uuid) -> Result<Option<GroupHead>, StoreError> {
        let row = sqlx::query_as(
            "SELECT g.group_id, w.tenant, w.status, w.deadline, w.state, g.mode, g.keep_running
             FROM wait_groups g JOIN waits w ON w.id = g.group_id WHERE g.group_id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn end_group(
        &self,
        id: Uuid,
        tenant: &str,
        status: &str,
        reason: &str,
        state: &str,
        output: Option<&Value>,
        now: DateTime<Utc>,
        event: &(&'static str, Value),
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i32,)> = sqlx::query_as(
            "UPDATE waits SET status = $3, reason = $4, state = $5, output = $7, finished_at = $6, updated_at = $6,
                    next_poll_at = NULL, owner = NULL, seq = seq + 1
             WHERE id = $1 AND tenant = $2 AND status = 'running'
             RETURNING seq",
        )
        .bind(id)
        .bind(tenant)
        .bind(status)
        .bind(reason)
        .bind(state)
        .bind(now)
        .bind(output)
        .fetch_optional(&mut *tx)
        .await?;
        self.append_one(tx, id, tenant, now, event, row).await
    }

    pub(super) async fn group_progress(
        &self,
        id: Uuid,
        tenant: &str,
        state: &str,
        now: DateTime<Utc>,
        event: &(&'static str, Value),
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i32,)> = sqlx::query_as(
            "UPDATE waits SET state = $3, updated_at = $4, seq = seq + 1
             WHERE id = $1 AND tenant = $2 AND status = 'running' AND state IS DISTINCT FROM $3
             RETURNING seq",
        )
        .bind(id)
        .bind(tenant)
        .bind(state)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        self.append_one(tx, id, tenant, now, event, row).await
    }

    /// Appends the event numbered `seq` when the update found the row, and commits.
    async fn append_one(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        id: Uuid,
        tenant: &str,
        now: DateTime<Utc>,
        event: &(&'static str, Value),
        row: Option<(i32,)>,
    ) -> Result<bool, StoreError> {
        let Some((seq,)) = row else {
            tx.commit().await?;
            return Ok(false);
        };
        sqlx::query(
            "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(seq)
        .bind(tenant)
        .bind(event.0)
        .bind(now)
        .bind(&event.1)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.committed.notify_one();
        Ok(true)
    }

    /// The rows of the groups `ids` (those that are groups), in one read.
    pub(super) async fn group_heads(&self, ids: &[Uuid]) -> Result<Vec<GroupHead>, StoreError> {
        let rows = sqlx::query_as(
            "SELECT g.group_id, w.tenant, w.status, w.deadline, w.state, g.mode, g.keep_running
             FROM wait_groups g JOIN waits w ON w.id = g.group_id WHERE g.group_id = ANY($1)",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// [`Self::end_group`] for many groups in one transaction: each row's update
    /// is conditional on its group still running, so a group another replica
    /// ended keeps that end. The ids of the groups this call ended.
    ///
    /// The rows are locked in id order first, as [`Self::groups_progress`] locks
    /// them: batches that share groups (two rounds' ends, a round's ends and the
    /// progress writer's batch, two replicas') wait for each other rather than
    /// deadlock.
    pub(super) async fn end_groups(
        &self,
        ends: &[GroupWrite<'_>],
        now: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let rows: Vec<(Uuid, i32)> = sqlx::query_as(
            "WITH locked AS MATERIALIZED (
                 SELECT id FROM waits WHERE id = ANY($1) ORDER BY id FOR UPDATE)
             UPDATE waits w SET status = d.status, reason = d.reason, state = d.state,
                    output = d.output::jsonb, finished_at = $6, updated_at = $6, next_poll_at = NULL, owner = NULL, seq = w.seq + 1
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $7::text[])
                  AS d(id, tenant, status, reason, state, output), locked l
             WHERE w.id = d.id AND l.id = d.id AND w.tenant = d.tenant AND w.status = 'running'
             RETURNING w.id, w.seq",
        )
        .bind(ends.iter().map(|e| e.id).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.tenant).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.status).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.reason).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.state).collect::<Vec<_>>())
        .bind(now)
        .bind(
            ends.iter()
                .map(|e| e.output.as_ref().map(Value::to_string))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *tx)
        .await?;
        self.append_many(tx, ends, rows, now).await
    }

    /// [`Self::group_progress`] for many groups in one transaction; the ids of
    /// the groups whose `state` changed.
    pub(super) async fn groups_progress(
        &self,
        writes: &[GroupWrite<'_>],
        now: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let rows: Vec<(Uuid, i32)> = sqlx::query_as(
            "WITH locked AS MATERIALIZED (
                 SELECT id FROM waits WHERE id = ANY($1) ORDER BY id FOR UPDATE)
             UPDATE waits w SET state = d.state, updated_at = $4, seq = w.seq + 1
             FROM unnest($1::uuid[], $2::text[], $3::text[]) AS d(id, tenant, state), locked l
             WHERE w.id = d.id AND l.id = d.id AND w.tenant = d.tenant AND w.status = 'running'
               AND w.state IS DISTINCT FROM d.state
             RETURNING w.id, w.seq",
        )
        .bind(writes.iter().map(|e| e.id).collect::<Vec<_>>())
        .bind(writes.iter().map(|e| e.tenant).collect::<Vec<_>>())
        .bind(writes.iter().map(|e| e.state).collect::<Vec<_>>())
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        self.append_many(tx, writes, rows, now).await
    }

    /// Appends each updated row's event, numbered by its new `seq`, and commits.
    async fn append_many(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        writes: &[GroupWrite<'_>],
        rows: Vec<(Uuid, i32)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError> {
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(vec![]);
        }
        let by_id: std::collections::HashMap<Uuid, &GroupWrite<'_>> =
            writes.iter().map(|w| (w.id, w)).collect();
        let mut ids = Vec::with_capacity(rows.len());
        let mut seqs = Vec::with_capacity(rows.len());
        let mut tenants = Vec::with_capacity(rows.len());
        let mut kinds = Vec::with_capacity(rows.len());
        let mut data = Vec::with_capacity(rows.len());
        for (id, seq) in rows {
            let Some(w) = by_id.get(&id) else { continue };
            ids.push(id);
            seqs.push(seq);
            tenants.push(w.tenant);
            kinds.push(w.event.0);
            data.push(w.event.1.to_string());
        }
        sqlx::query(
            "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data)
             SELECT i, s, t, k, $6, d::jsonb
             FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[]) AS x(i, s, t, k, d)",
        )
        .bind(&ids)
        .bind(&seqs)
        .bind(&tenants)
        .bind(&kinds)
        .bind(&data)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.committed.notify_one();
        Ok(ids)
    }

    pub(super) async fn groups_to_settle(
        &self,
        now: DateTime<Utc>,
        all: bool,
        recent: chrono::Duration,
        limit: i64,
    ) -> Result<Vec<Uuid>, StoreError> {
        let rows: Vec<(Uuid,)> = sqlx::query_as(
            "SELECT g.group_id FROM wait_groups g JOIN waits w ON w.id = g.group_id
             WHERE (w.status = 'running' AND ($2 OR w.deadline <= $1))
                OR (w.status <> 'running'
                    AND CASE WHEN g.keep_running THEN w.deadline <= $1 AND ($2 OR w.deadline > $4)
                             ELSE $2 END
                    AND EXISTS (
                    SELECT 1 FROM group_members m JOIN waits x ON x.id = m.member_id
                    WHERE m.group_id = g.group_id AND x.status = 'running'))
             ORDER BY g.group_id LIMIT $3",
        )
        .bind(now)
        .bind(all)
        .bind(limit)
        .bind(now - recent)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }
}
