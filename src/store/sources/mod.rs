//! Event sources (docs/design.md §2.18), through the [`Sources`] handle: a
//! tenant's named receivers of signed webhooks, the events they keep for their
//! lookback window, and the index of waits listening for an event's key.
//!
//! The signing secret is sealed at rest as target header values are
//! ([`super::secrets`]), and only [`Sources::by_id`] opens it, for checking a
//! signature: no read path carries it. Times are milliseconds since the epoch on
//! both databases, so that each statement is the same on both apart from its
//! placeholders (SQLite's `?N`). On SQLite a wait's spec is text; Postgres casts
//! its `jsonb` to text in the same statement, so both read it alike.
//!
//! An event is kept only when its tenant's kept events, counted with this one,
//! stay within [`EventCaps`]: under concurrent receipts the count may run past
//! the cap by the receipts in flight, never further.

mod postgres;
mod sqlite;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use super::{Core, StoreError};

/// The owner of the operator's sources (docs/design.md §2.18): not a tenant
/// name, so no tenant's list, read or delete reaches them by their owner, and
/// their kept events are counted under caps of their own.
pub const OPERATOR: &str = "*";

/// A source's kind: how its events are signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`.
    Github,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    StandardWebhooks,
    /// `Authorization: Bearer <secret>`.
    Bearer,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Github, Kind::StandardWebhooks, Kind::Bearer];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Github => "github",
            Kind::StandardWebhooks => "standard-webhooks",
            Kind::Bearer => "bearer",
        }
    }

    pub fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// A source as every read shows it: never its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The random id in its hook URL.
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub kind: Kind,
    /// How an event's key is read: a JSON Pointer or a CEL expression.
    pub key_from: String,
    pub lookback: Duration,
    pub created_at: DateTime<Utc>,
}

/// A source to create.
#[derive(Clone, Copy)]
pub struct NewSource<'a> {
    pub tenant: &'a str,
    pub name: &'a str,
    pub kind: Kind,
    pub key_from: &'a str,
    pub lookback: Duration,
    pub secret: &'a str,
}

/// An event to keep.
pub struct NewEvent<'a> {
    pub source: &'a Source,
    pub delivery: &'a str,
    pub key: Option<&'a str>,
    pub body: &'a str,
    /// The headers a `match` may read, as a JSON object of text.
    pub headers: &'a str,
    pub received: DateTime<Utc>,
}

/// What keeping an event came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Kept now: its effects are due.
    New,
    /// Its delivery id was kept already: a replay, with no effect.
    Replayed,
    /// Its tenant's kept events are at a cap: nothing was kept.
    Full,
}

/// The most events, and bytes of event bodies and headers, one tenant keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventCaps {
    pub events: i64,
    pub bytes: i64,
}

/// A kept event, as a wait created after it reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptEvent {
    pub delivery: String,
    pub body: String,
    pub headers: String,
}

/// A running wait listening for a key, with its spec (as stored, as JSON).
#[derive(Clone, Debug)]
pub struct Listener {
    pub wait_id: Uuid,
    pub tenant: String,
    pub spec: String,
}

/// The stored row of a source, as both databases read it.
pub(in crate::store) type SourceRow = (String, String, String, String, String, i64, String, i64);

/// How a tenant's new source meets one of its name: it is not made.
const NEW_NAME: &str = "ON CONFLICT (tenant, name) DO NOTHING";
/// How an operator's source meets its row of an earlier start: it is updated in
/// place (its events and listeners stay), unless a tenant's source has its id.
const SAME_ID: &str = "ON CONFLICT (id) DO UPDATE SET name = excluded.name, kind = excluded.kind,
     key_from = excluded.key_from, lookback_ms = excluded.lookback_ms, secret = excluded.secret
     WHERE event_sources.tenant = excluded.tenant";

/// Event sources, their kept events and their listeners. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Sources {
    pub(super) core: Arc<Core>,
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn source_of(row: SourceRow) -> Result<(Source, String), StoreError> {
    let (id, tenant, name, kind, key_from, lookback_ms, secret, created_ms) = row;
    let kind = Kind::parse(&kind).ok_or_else(|| StoreError::Decode {
        what: "event source kind",
        why: format!("\"{kind}\" is not a kind this version knows"),
    })?;
    Ok((
        Source {
            id,
            tenant,
            name,
            kind,
            key_from,
            lookback: Duration::from_millis(lookback_ms.max(0) as u64),
            created_at: Utc
                .timestamp_millis_opt(created_ms)
                .single()
                .unwrap_or_default(),
        },
        secret,
    ))
}

impl Sources {
    /// Creates a source with a fresh random id; `None` when the tenant has one of
    /// this name already.
    pub async fn create(
        &self,
        new: &NewSource<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<Source>, StoreError> {
        let id = crate::store::callbacks::Secret::generate().expose()[..32].to_string();
        let row = self.row(&id, new, now)?;
        let made = sql!(self.insert_source(&row, NEW_NAME))?;
        if !made {
            return Ok(None);
        }
        Ok(Some(source_of(row)?.0))
    }

    /// The stored row of `new` with the hook id `id`, its secret sealed.
    fn row(
        &self,
        id: &str,
        new: &NewSource<'_>,
        now: DateTime<Utc>,
    ) -> Result<SourceRow, StoreError> {
        let sealed = self
            .core
            .cipher
            .seal(&BTreeMap::from([(
                "secret".to_string(),
                new.secret.to_string(),
            )]))
            .map_err(|e| StoreError::Config(e.to_string()))?
            .to_string();
        Ok((
            id.to_string(),
            new.tenant.to_string(),
            new.name.to_string(),
            new.kind.as_str().to_string(),
            new.key_from.to_string(),
            millis(new.lookback),
            sealed,
            ms(now),
        ))
    }

    /// Makes the operator's sources, owned by [`OPERATOR`], those declared
    /// (each a hook id and the source): each is kept or updated in place, so its
    /// kept events and listeners stay; a name given a new hook id loses the old
    /// one's; and a source no longer declared is deleted with its events and
    /// listeners. Every replica does this at start-up with the same file, so any
    /// order of them comes to the same rows. An error names the hook id of a
    /// tenant's source, which it does not take.
    ///
    /// Replicas started at once race to insert the same rows: the one that
    /// loses the race on a name meets the other's row as a unique violation
    /// (its insert's conflict target is the id), and declares again, now
    /// finding the row to keep.
    pub async fn declare_operator(
        &self,
        declared: &[(&str, NewSource<'_>)],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut tries = 0;
        loop {
            match self.declare_operator_once(declared, now).await {
                Err(StoreError::Database(sqlx::Error::Database(e)))
                    if e.is_unique_violation() && tries < 3 =>
                {
                    tries += 1;
                }
                done => return done,
            }
        }
    }

    async fn declare_operator_once(
        &self,
        declared: &[(&str, NewSource<'_>)],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        for (id, new) in declared {
            let row = self.row(
                id,
                &NewSource {
                    tenant: OPERATOR,
                    ..*new
                },
                now,
            )?;
            if let Some(old) = self.get(OPERATOR, new.name).await?
                && old.id != *id
            {
                sql!(self.delete_source(OPERATOR, new.name))?;
            }
            if !sql!(self.insert_source(&row, SAME_ID))? {
                return Err(StoreError::Config(format!(
                    "the operator's source \"{}\" cannot have its hook_id: a tenant's source has it; choose another",
                    new.name
                )));
            }
        }
        for gone in self.list(OPERATOR).await? {
            if !declared.iter().any(|(_, d)| d.name == gone.name) {
                sql!(self.delete_source(OPERATOR, &gone.name))?;
            }
        }
        Ok(())
    }

    /// How many sources `tenant` has.
    pub async fn count(&self, tenant: &str) -> Result<i64, StoreError> {
        sql!(self.count_sources(tenant))
    }

    /// `tenant`'s sources, by name.
    pub async fn list(&self, tenant: &str) -> Result<Vec<Source>, StoreError> {
        sql!(self.list_sources(tenant))?
            .into_iter()
            .map(|r| source_of(r).map(|s| s.0))
            .collect()
    }

    /// `tenant`'s source called `name`.
    pub async fn get(&self, tenant: &str, name: &str) -> Result<Option<Source>, StoreError> {
        sql!(self.get_source(tenant, name))?
            .map(|r| source_of(r).map(|s| s.0))
            .transpose()
    }

    /// The source a hook URL names, with its secret opened: for checking a
    /// signature, and for nothing else.
    pub async fn by_id(&self, id: &str) -> Result<Option<(Source, String)>, StoreError> {
        let Some(row) = sql!(self.source_by_id(id))? else {
            return Ok(None);
        };
        let (source, sealed) = source_of(row)?;
        let stored: serde_json::Value =
            serde_json::from_str(&sealed).map_err(|e| StoreError::Decode {
                what: "event source secret",
                why: e.to_string(),
            })?;
        let mut opened = self
            .core
            .cipher
            .open(&stored)
            .map_err(|e| StoreError::Decode {
                what: "event source secret",
                why: e.to_string(),
            })?;
        let secret = opened.remove("secret").unwrap_or_default();
        Ok(Some((source, secret)))
    }

    /// Deletes `tenant`'s source called `name`, its kept events and its
    /// listeners; false when there was none.
    pub async fn delete(&self, tenant: &str, name: &str) -> Result<bool, StoreError> {
        sql!(self.delete_source(tenant, name))
    }

    /// Keeps an event, once per delivery id, within the tenant's caps.
    pub async fn keep(&self, e: &NewEvent<'_>, caps: EventCaps) -> Result<Kept, StoreError> {
        if sql!(self.has_event(&e.source.id, e.delivery))? {
            return Ok(Kept::Replayed);
        }
        let bytes = (e.body.len() + e.headers.len()) as i64;
        let received = ms(e.received);
        let expires = received.saturating_add(millis(e.source.lookback));
        let kept = sql!(self.insert_event(e, bytes, received, expires, caps))?;
        if kept {
            return Ok(Kept::New);
        }
        // Refused: by a delivery kept meanwhile, or by the caps.
        if sql!(self.has_event(&e.source.id, e.delivery))? {
            Ok(Kept::Replayed)
        } else {
            Ok(Kept::Full)
        }
    }

    /// Records that `wait_id` listens to `source_id` for `key`.
    pub async fn listen(
        &self,
        source_id: &str,
        key: &str,
        wait_id: Uuid,
    ) -> Result<(), StoreError> {
        sql!(self.insert_listener(source_id, key, wait_id))
    }

    /// The running waits listening to `source_id` for `key`, at most `limit`.
    pub async fn listeners(
        &self,
        source_id: &str,
        key: &str,
        limit: i64,
    ) -> Result<Vec<Listener>, StoreError> {
        Ok(sql!(self.find_listeners(source_id, key, limit))?
            .into_iter()
            .map(|(wait_id, tenant, spec)| Listener {
                wait_id,
                tenant,
                spec,
            })
            .collect())
    }

    /// The events `source_id` keeps for `key` that have not expired at `now`,
    /// oldest first, at most `limit`.
    pub async fn kept(
        &self,
        source_id: &str,
        key: &str,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<KeptEvent>, StoreError> {
        Ok(sql!(self.kept_events(source_id, key, ms(now), limit))?
            .into_iter()
            .map(|(delivery, body, headers)| KeptEvent {
                delivery,
                body,
                headers,
            })
            .collect())
    }

    /// Deletes up to `limit` events expired before `now`; how many it deleted.
    pub async fn sweep(&self, now: DateTime<Utc>, limit: i64) -> Result<u64, StoreError> {
        sql!(self.sweep_events(ms(now), limit))
    }
}
