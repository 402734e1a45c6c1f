//! Event sources on Postgres.

use uuid::Uuid;

use super::{EventCaps, NewEvent, SourceRow};
use crate::store::{PgDialect, StoreError};

const COLUMNS: &str = "id, tenant, name, kind, key_from, lookback_ms, secret, created_ms";

impl PgDialect {
    pub(in crate::store) async fn insert_source(
        &self,
        r: &SourceRow,
        on_conflict: &str,
    ) -> Result<bool, StoreError> {
        let n = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO event_sources (id, tenant, name, kind, key_from, lookback_ms, secret, created_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) {on_conflict}"
        )))
        .bind(&r.0)
        .bind(&r.1)
        .bind(&r.2)
        .bind(&r.3)
        .bind(&r.4)
        .bind(r.5)
        .bind(&r.6)
        .bind(r.7)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    pub(in crate::store) async fn count_sources(&self, tenant: &str) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM event_sources WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }

    pub(in crate::store) async fn list_sources(
        &self,
        tenant: &str,
    ) -> Result<Vec<SourceRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM event_sources WHERE tenant = $1 ORDER BY name"
        )))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(in crate::store) async fn get_source(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<SourceRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM event_sources WHERE tenant = $1 AND name = $2"
        )))
        .bind(tenant)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?)
    }

    pub(in crate::store) async fn source_by_id(
        &self,
        id: &str,
    ) -> Result<Option<SourceRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM event_sources WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    pub(in crate::store) async fn delete_source(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<bool, StoreError> {
        let n = sqlx::query("DELETE FROM event_sources WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(name)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    pub(in crate::store) async fn has_event(
        &self,
        source_id: &str,
        delivery: &str,
    ) -> Result<bool, StoreError> {
        let found: Option<(i32,)> =
            sqlx::query_as("SELECT 1 FROM source_events WHERE source_id = $1 AND delivery = $2")
                .bind(source_id)
                .bind(delivery)
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.is_some())
    }

    pub(in crate::store) async fn insert_event(
        &self,
        e: &NewEvent<'_>,
        bytes: i64,
        received: i64,
        expires: i64,
        caps: EventCaps,
    ) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "WITH used AS (
                 SELECT count(*) AS n, coalesce(sum(bytes), 0)::bigint AS b
                 FROM source_events WHERE tenant = $3 AND expires_ms > $8)
             INSERT INTO source_events
                 (source_id, delivery, tenant, key, body, headers, bytes, received_ms, expires_ms)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 FROM used
             WHERE used.n < $10 AND used.b + $7 <= $11
             ON CONFLICT (source_id, delivery) DO NOTHING",
        )
        .bind(&e.source.id)
        .bind(e.delivery)
        .bind(&e.source.tenant)
        .bind(e.key)
        .bind(e.body)
        .bind(e.headers)
        .bind(bytes)
        .bind(received)
        .bind(expires)
        .bind(caps.events)
        .bind(caps.bytes)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    pub(in crate::store) async fn insert_listener(
        &self,
        source_id: &str,
        key: &str,
        wait_id: Uuid,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO wait_listeners (source_id, key, wait_id) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(source_id)
        .bind(key)
        .bind(wait_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(in crate::store) async fn find_listeners(
        &self,
        source_id: &str,
        key: &str,
        limit: i64,
    ) -> Result<Vec<(Uuid, String, String)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT w.id, w.tenant, s.spec::text
             FROM wait_listeners l
             JOIN waits w ON w.id = l.wait_id
             JOIN wait_specs s ON s.wait_id = l.wait_id
             WHERE l.source_id = $1 AND l.key = $2 AND w.status = 'running'
             LIMIT $3",
        )
        .bind(source_id)
        .bind(key)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(in crate::store) async fn kept_events(
        &self,
        source_id: &str,
        key: &str,
        now: i64,
        limit: i64,
    ) -> Result<Vec<(String, String, String)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT delivery, body, headers FROM source_events
             WHERE source_id = $1 AND key = $2 AND expires_ms > $3
             ORDER BY received_ms LIMIT $4",
        )
        .bind(source_id)
        .bind(key)
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(in crate::store) async fn sweep_events(
        &self,
        now: i64,
        limit: i64,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "DELETE FROM source_events WHERE ctid IN (
                 SELECT ctid FROM source_events WHERE expires_ms <= $1 LIMIT $2)",
        )
        .bind(now)
        .bind(limit)
        .execute(&self.pool)
        .await?
        .rows_affected())
    }
}
