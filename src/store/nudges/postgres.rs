//! Nudges on Postgres.

use uuid::Uuid;

use super::NudgeRow;
use crate::store::postgres::NUDGE_CHANNEL;
use crate::store::{PgDialect, StoreError};

impl PgDialect {
    pub(in crate::store) async fn register_nudge(
        &self,
        wait_id: Uuid,
        tenant: &str,
        hash: &[u8],
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO wait_nudges (wait_id, tenant, secret_hash) VALUES ($1, $2, $3)")
            .bind(wait_id)
            .bind(tenant)
            .bind(hash)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(in crate::store) async fn find_nudge(
        &self,
        hash: &[u8],
    ) -> Result<Option<NudgeRow>, StoreError> {
        let found: Option<(Uuid, String, Vec<u8>, bool)> = sqlx::query_as(
            "SELECT n.wait_id, n.tenant, n.secret_hash, w.status = 'running'
             FROM wait_nudges n JOIN waits w ON w.id = n.wait_id
             WHERE n.secret_hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(
            found.map(|(wait_id, tenant, secret_hash, running)| NudgeRow {
                wait_id,
                tenant,
                secret_hash,
                running,
            }),
        )
    }

    /// Every replica's LISTEN adapter hears it; the one holding the wait polls.
    pub(in crate::store) async fn announce_nudge(&self, wait_id: Uuid) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(NUDGE_CHANNEL)
            .bind(wait_id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
