//! Groups on SQLite: SQL only (see [`super`]).

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{GroupHead, LinkRow, NewGroup};
use crate::store::columns::Json;
use crate::store::events::sqlite::append_events;
use crate::store::sqlite::{SqliteDialect, ms};
use crate::store::{Admission, Inserted, StoreError};

/// `?, ?, …` for `n` parameters.
fn params(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl SqliteDialect {
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
        let counted = match crate::store::waits::sqlite::admit(&mut tx, tenant, admission).await? {
            Ok(counted) => counted,
            Err(n) => return Ok(Inserted::Full(n)),
        };
        sqlx::query(
            "INSERT INTO waits (id, tenant, status, state, created_at, updated_at, deadline, next_poll_at, labels, engine, seq)
             VALUES (?, ?, 'running', ?, ?, ?, ?, NULL, ?, ?, 1)",
        )
        .bind(nw.id)
        .bind(tenant)
        .bind(&g.state)
        .bind(ms(now))
        .bind(ms(now))
        .bind(ms(nw.engine.deadline))
        .bind(nw.labels.to_string())
        .bind(nw.engine_json.to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO wait_specs (wait_id, spec, headers, trace) VALUES (?, ?, ?, ?)")
            .bind(nw.id)
            .bind(nw.spec.to_string())
            .bind(nw.headers.to_string())
            .bind(&nw.trace)
            .execute(&mut *tx)
            .await?;
        if let Some((key, hash)) = idempotency
            && !crate::store::waits::sqlite::take_key(&mut tx, tenant, key, hash, nw.id, now)
                .await?
        {
            tx.rollback().await?;
            return Ok(Inserted::KeyTaken);
        }
        for n in &nw.notify {
            sqlx::query(
                "INSERT INTO wait_notify (wait_id, endpoint, url, kinds, secret) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(nw.id)
            .bind(n.endpoint)
            .bind(&n.url)
            .bind(n.kinds)
            .bind(n.secret.to_string())
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("INSERT INTO wait_groups (group_id, mode, keep_running) VALUES (?, ?, ?)")
            .bind(nw.id)
            .bind(g.mode)
            .bind(g.keep_running)
            .execute(&mut *tx)
            .await?;
        for (i, (member, required)) in g.members.iter().enumerate() {
            sqlx::query(
                "INSERT INTO group_members (group_id, position, member_id, required) VALUES (?, ?, ?, ?)",
            )
            .bind(nw.id)
            .bind(i as i32)
            .bind(member)
            .bind(required)
            .execute(&mut *tx)
            .await?;
        }
        for member in &g.by_id {
            // The group's deadline caps its members': a claim takes the earlier of
            // this column and the engine's own (and the next poll is no later).
            let cap = ms(nw.engine.deadline);
            sqlx::query(
                "UPDATE waits SET deadline = ?2, next_poll_at = MIN(next_poll_at, ?2)
                 WHERE id = ?1 AND status = 'running' AND deadline > ?2",
            )
            .bind(member)
            .bind(cap)
            .execute(&mut *tx)
            .await?;
        }
        let notice = append_events(
            &mut tx,
            nw.id,
            tenant,
            now,
            std::slice::from_ref(&nw.created),
            0,
        )
        .await?;
        tx.commit().await?;
        self.publish(notice.into_iter().collect());
        Ok(Inserted::Yes { counted })
    }

    pub(super) async fn group_links(&self, ids: &[Uuid]) -> Result<Vec<LinkRow>, StoreError> {
        let list = params(ids.len());
        let sql = format!(
            "SELECT m.group_id, g.mode, m.position, m.member_id, m.required, x.status, x.deadline
             FROM group_members m
             JOIN wait_groups g ON g.group_id = m.group_id
             JOIN waits x ON x.id = m.member_id
             WHERE m.group_id IN ({list}) OR m.member_id IN ({list})"
        );
        let mut q = sqlx::query_as::<_, LinkRow>(sqlx::AssertSqlSafe(sql));
        for _ in 0..2 {
            for id in ids {
                q = q.bind(*id);
            }
        }
        Ok(q.fetch_all(&self.pool).await?)
    }

    /// The outputs of those of `ids` that ended with one.
    pub(super) async fn outputs(&self, ids: &[Uuid]) -> Result<Vec<(Uuid, Json)>, StoreError> {
        let sql = format!(
            "SELECT id, output FROM waits WHERE id IN ({}) AND output IS NOT NULL",
            params(ids.len())
        );
        let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql));
        for id in ids {
            q = q.bind(*id);
        }
        Ok(q.fetch_all(&self.pool).await?)
    }

    pub(super) async fn group_head(&self, id: Uuid) -> Result<Option<GroupHead>, StoreError> {
        let row = sqlx::query_as(
            "SELECT g.group_id, w.tenant, w.status, w.deadline, w.state, g.mode, g.keep_running
             FROM wait_groups g JOIN waits w ON w.id = g.group_id WHERE g.group_id = ?",
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
            "UPDATE waits SET status = ?, reason = ?, state = ?, output = ?, finished_at = ?, updated_at = ?,
                    next_poll_at = NULL, owner = NULL, seq = seq + 1
             WHERE id = ? AND tenant = ? AND status = 'running'
             RETURNING seq",
        )
        .bind(status)
        .bind(reason)
        .bind(state)
        .bind(output.map(Value::to_string))
        .bind(ms(now))
        .bind(ms(now))
        .bind(id)
        .bind(tenant)
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
            "UPDATE waits SET state = ?, updated_at = ?, seq = seq + 1
             WHERE id = ? AND tenant = ? AND status = 'running' AND state IS NOT ?
             RETURNING seq",
        )
        .bind(state)
        .bind(ms(now))
        .bind(id)
        .bind(tenant)
        .bind(state)
        .fetch_optional(&mut *tx)
        .await?;
        self.append_one(tx, id, tenant, now, event, row).await
    }

    /// Appends the event numbered `seq` when the update found the row, commits,
    /// and publishes its notice.
    async fn append_one(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Sqlite>,
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
        let notice = append_events(
            &mut tx,
            id,
            tenant,
            now,
            std::slice::from_ref(event),
            seq - 1,
        )
        .await?;
        tx.commit().await?;
        self.publish(notice.into_iter().collect());
        Ok(true)
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
             WHERE (w.status = 'running' AND (?1 OR w.deadline <= ?2))
                OR (w.status <> 'running'
                    AND CASE WHEN g.keep_running THEN w.deadline <= ?2 AND (?1 OR w.deadline > ?4)
                             ELSE ?1 END
                    AND EXISTS (
                    SELECT 1 FROM group_members m JOIN waits x ON x.id = m.member_id
                    WHERE m.group_id = g.group_id AND x.status = 'running'))
             ORDER BY g.group_id LIMIT ?3",
        )
        .bind(all)
        .bind(ms(now))
        .bind(limit)
        .bind(ms(now - recent))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }
}
