//! Waits' own statements on SQLite: creating one (with its key, its count and its
//! webhooks), reading, listing and canceling.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::bus::BusMsg;
use crate::store::events::sqlite::append_events;
use crate::store::sqlite::{SqliteDialect, ms};
use crate::store::{
    Admission, GROUPED_COLUMN, GotRow, Inserted, ListFilter, NewWait, StoreError, WAIT_COLUMNS,
    WaitRow,
};

impl SqliteDialect {
    pub(in crate::store) async fn find_idempotent(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<(String, Uuid)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT request_hash, wait_id FROM idempotency_keys WHERE tenant = ? AND key = ?",
        )
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// One transaction: the count (one connection is the only writer, so it holds),
    /// the insert, the key.
    pub(super) async fn insert_wait(
        &self,
        tenant: &str,
        now: DateTime<Utc>,
        nw: &NewWait,
        idempotency: Option<(&str, &str)>,
        admission: Admission,
    ) -> Result<Inserted, StoreError> {
        let mut tx = self.pool.begin().await?;
        let counted = match admit(&mut tx, tenant, admission).await? {
            Ok(counted) => counted,
            Err(n) => return Ok(Inserted::Full(n)),
        };
        sqlx::query(
            "INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq)
             VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, 1)",
        )
        .bind(nw.id)
        .bind(tenant)
        .bind(ms(now))
        .bind(ms(now))
        .bind(ms(nw.engine.deadline))
        .bind(ms(nw.first_poll))
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
            && !take_key(&mut tx, tenant, key, hash, nw.id, now).await?
        {
            tx.rollback().await?;
            return Ok(Inserted::KeyTaken);
        }
        // Before the `created` event, so that the outbox trigger finds them.
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
        self.bus.publish(BusMsg::Work);
        Ok(Inserted::Yes { counted })
    }

    pub(in crate::store) async fn get(
        &self,
        tenant: &str,
        id: Uuid,
    ) -> Result<Option<GotRow>, StoreError> {
        let sql = format!(
            "SELECT {WAIT_COLUMNS}, {GROUPED_COLUMN} FROM waits w JOIN wait_specs s ON s.wait_id = w.id WHERE w.id = ? AND w.tenant = ?"
        );
        let row: Option<GotRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row)
    }

    pub(in crate::store) async fn list(
        &self,
        tenant: &str,
        filter: &ListFilter,
    ) -> Result<Vec<WaitRow>, StoreError> {
        // Label keys, of waits and of filters alike, are validated to [A-Za-z0-9-_./]
        // (the API refuses any other filter), so a key quoted in a JSON path means
        // itself; it is bound as a parameter all the same.
        let mut sql = format!(
            "SELECT {WAIT_COLUMNS} FROM waits w JOIN wait_specs s ON s.wait_id = w.id
             WHERE w.tenant = ? AND (? IS NULL OR w.status = ?) AND (? IS NULL OR w.id < ?)"
        );
        for _ in &filter.labels {
            sql.push_str(" AND json_extract(w.labels, ?) = ?");
        }
        sql.push_str(" ORDER BY w.id DESC LIMIT ?");
        let status = filter.status.map(|s| s.as_str());
        let mut q = sqlx::query_as::<_, WaitRow>(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(status)
            .bind(status)
            .bind(filter.before)
            .bind(filter.before);
        for (k, v) in &filter.labels {
            q = q.bind(format!("$.\"{k}\"")).bind(v);
        }
        let rows = q.bind(filter.limit).fetch_all(&self.pool).await?;
        Ok(rows)
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::store) async fn end_running(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
        reason: &str,
        status: &str,
        error_detail: Option<&Value>,
        output: Option<&Value>,
        event: &(dyn Fn(Option<String>) -> (&'static str, Value) + Sync),
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i32, Option<String>)> = sqlx::query_as(
            "UPDATE waits SET status = ?, reason = ?, error_detail = ?, output = ?, finished_at = ?, updated_at = ?,
                    next_poll_at = NULL, owner = NULL, seq = seq + 1
             WHERE id = ? AND tenant = ? AND status = 'running'
             RETURNING seq, state",
        )
        .bind(status)
        .bind(reason)
        .bind(error_detail.map(Value::to_string))
        .bind(output.map(Value::to_string))
        .bind(ms(now))
        .bind(ms(now))
        .bind(id)
        .bind(tenant)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((seq, state)) = row else {
            tx.commit().await?;
            return Ok(false);
        };
        let notice = append_events(&mut tx, id, tenant, now, &[event(state)], seq - 1).await?;
        tx.commit().await?;
        self.publish(notice.into_iter().collect());
        Ok(true)
    }

    pub(in crate::store) async fn count_running(
        &self,
        tenant: Option<&str>,
    ) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM waits WHERE status = 'running' AND (? IS NULL OR tenant = ?)",
        )
        .bind(tenant)
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
}

/// Takes the idempotency key for the wait being inserted in `tx`: false when
/// another request took it first (the caller rolls back).
pub(in crate::store) async fn take_key(
    tx: &mut sqlx::SqliteConnection,
    tenant: &str,
    key: &str,
    hash: &str,
    id: Uuid,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO idempotency_keys (tenant, key, request_hash, wait_id, created_at)
         VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(key)
    .bind(hash)
    .bind(id)
    .bind(ms(now))
    .execute(tx)
    .await?
    .rows_affected();
    Ok(inserted > 0)
}

/// Admission within a create's transaction: the tenant's running count when one
/// is to be taken (one connection is the only writer, so it holds until the
/// insert), or `Err` with the count when the tenant is at `max`.
pub(in crate::store) async fn admit(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    tenant: &str,
    admission: Admission,
) -> Result<Result<Option<i64>, i64>, StoreError> {
    let Admission::Count { max } = admission else {
        return Ok(Ok(None));
    };
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM waits WHERE status = 'running' AND tenant = ?")
            .bind(tenant)
            .fetch_one(&mut **tx)
            .await?;
    Ok(if n >= max { Err(n) } else { Ok(Some(n)) })
}
