//! Creates that share a statement: every create that needs no count of the
//! tenant's running waits (the tenant is far under its limit, or has none) joins
//! the next batch, and a batch is one statement and one commit, whatever its size.
//! A commit is most of what a lone create costs Postgres (its WAL flush, the outbox
//! and notice triggers, which run once a statement, and the word on the work
//! channel), so concurrent creates cost it a fraction each.
//!
//! No task waits for work: the create that finds fewer than [`RUNNERS`] batches
//! running starts one, which takes what is queued (at most [`MOST`]), writes it, and
//! goes on until the queue is empty. A batch runs as a task of its own, so a client
//! that goes away does not cut it, and no create is left waiting on one that is.
//!
//! A create with an `Idempotency-Key` takes its key in the same statement; one that
//! finds its key taken (by a create of the same batch, or another's) inserts
//! nothing, and the caller answers with the wait that holds the key. A batch whose
//! statement fails is written again one create at a time, so one create the
//! database refuses fails alone.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::store::postgres::PgDialect;
use crate::store::{Inserted, NewWait, StoreError};

/// Batches written at once: one to fill while another commits.
const RUNNERS: usize = 2;
/// Creates a statement at most: its arrays stay a few hundred KiB.
const MOST: usize = 256;

/// The creates waiting for a batch, and how many batches are running.
#[derive(Default)]
pub(in crate::store) struct Creates {
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Creates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The queued rows hold header values: secrets.
        f.debug_struct("Creates").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Queue {
    asks: Vec<Ask>,
    running: usize,
}

/// One create: its rows as the statement binds them, and where its answer goes.
struct Ask {
    row: Row,
    answer: oneshot::Sender<Result<Inserted, StoreError>>,
}

struct Row {
    id: Uuid,
    tenant: String,
    now: DateTime<Utc>,
    deadline: DateTime<Utc>,
    first_poll: DateTime<Utc>,
    labels: String,
    engine: String,
    spec: String,
    headers: String,
    trace: Option<String>,
    placement: Option<i64>,
    kind: &'static str,
    data: String,
    key: Option<(String, String)>,
    notify: Vec<(i32, String, i32, String)>,
}

impl Row {
    fn of(tenant: &str, now: DateTime<Utc>, nw: &NewWait, key: Option<(&str, &str)>) -> Row {
        Row {
            id: nw.id,
            tenant: tenant.to_string(),
            now,
            deadline: nw.engine.deadline,
            first_poll: nw.first_poll,
            labels: nw.labels.to_string(),
            engine: nw.engine_json.to_string(),
            spec: nw.spec.to_string(),
            headers: nw.headers.to_string(),
            trace: nw.trace.clone(),
            placement: nw.placement,
            kind: nw.created.0,
            data: nw.created.1.to_string(),
            key: key.map(|(k, h)| (k.to_string(), h.to_string())),
            notify: nw
                .notify
                .iter()
                .map(|n| (n.endpoint, n.url.clone(), n.kinds, n.secret.to_string()))
                .collect(),
        }
    }
}

impl PgDialect {
    /// Inserts a new wait (and takes its key) in the next batch of creates.
    pub(super) async fn insert_batched(
        &self,
        creates: &Arc<Creates>,
        tenant: &str,
        now: DateTime<Utc>,
        nw: &NewWait,
        key: Option<(&str, &str)>,
    ) -> Result<Inserted, StoreError> {
        let (answer, answered) = oneshot::channel();
        let ask = Ask {
            row: Row::of(tenant, now, nw, key),
            answer,
        };
        let start = {
            let mut q = creates.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.asks.push(ask);
            let start = q.running < RUNNERS;
            if start {
                q.running += 1;
            }
            start
        };
        if start {
            tokio::spawn(run(self.clone(), creates.clone()));
        }
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::Decode {
                what: "batch of creates",
                why: "its task ended without an answer".into(),
            })
        })
    }
}

/// Writes batches until none is queued.
async fn run(pg: PgDialect, creates: Arc<Creates>) {
    loop {
        let batch: Vec<Ask> = {
            let mut q = creates.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.asks.is_empty() {
                q.running -= 1;
                return;
            }
            let n = q.asks.len().min(MOST);
            q.asks.drain(..n).collect()
        };
        let rows: Vec<&Row> = batch.iter().map(|a| &a.row).collect();
        match write(&pg, &rows).await {
            Ok(inserted) => {
                pg.committed.notify_one();
                for ask in batch {
                    let _ = ask.answer.send(Ok(answer(&ask.row, &inserted)));
                }
            }
            Err(e) if batch.len() == 1 => {
                if let Some(ask) = batch.into_iter().next() {
                    let _ = ask.answer.send(Err(e));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, creates = batch.len(), "a batch of creates failed; writing them one at a time");
                for ask in batch {
                    let one = write(&pg, &[&ask.row]).await;
                    if one.is_ok() {
                        pg.committed.notify_one();
                    }
                    let _ = ask
                        .answer
                        .send(one.map(|inserted| answer(&ask.row, &inserted)));
                }
            }
        }
    }
}

fn answer(row: &Row, inserted: &HashSet<Uuid>) -> Inserted {
    if inserted.contains(&row.id) {
        Inserted::Yes { counted: None }
    } else {
        Inserted::KeyTaken
    }
}

/// One statement for the batch: the keys first (a create whose key is taken goes
/// no further), then the waits, their specs, webhooks and `created` events, and
/// the word on the work channel. The ids of the waits inserted.
async fn write(pg: &PgDialect, rows: &[&Row]) -> Result<HashSet<Uuid>, StoreError> {
    let mut c = Columns::default();
    for r in rows {
        c.push(r);
    }
    let ids: Vec<(Uuid,)> = sqlx::query_as(concat!(
        "WITH input AS MATERIALIZED (
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[],
                                  $5::timestamptz[], $6::text[], $7::text[], $8::text[], $9::text[],
                                  $10::text[], $11::bigint[], $12::text[], $13::text[], $14::text[],
                                  $15::text[])
                 WITH ORDINALITY AS t(id, tenant, at, deadline, first_poll, labels, engine, spec,
                                      headers, trace, placement, kind, data, key, hash, ord)),
         keys AS (
             INSERT INTO idempotency_keys (tenant, key, request_hash, wait_id, created_at)
             SELECT tenant, key, hash, id, at FROM input WHERE key IS NOT NULL ORDER BY ord
             ON CONFLICT DO NOTHING
             RETURNING wait_id),
         chosen AS MATERIALIZED (
             SELECT * FROM input WHERE key IS NULL OR id IN (SELECT wait_id FROM keys)),
         w AS (
             INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at,
                                claim_at, labels, engine, seq, placement)
             SELECT id, tenant, 'running', at, at, deadline, first_poll, first_poll, labels::jsonb,
                    engine::jsonb, 1, placement
             FROM chosen ORDER BY ord),
         s AS (
             INSERT INTO wait_specs (wait_id, spec, headers, trace)
             SELECT id, spec::jsonb, headers::jsonb, trace FROM chosen),
         n AS (
             INSERT INTO wait_notify (wait_id, endpoint, url, kinds, secret)
             SELECT h.w, h.e, h.u, h.k, h.x::jsonb
             FROM unnest($16::uuid[], $17::int[], $18::text[], $19::int[], $20::text[]) AS h(w, e, u, k, x)
             WHERE h.w IN (SELECT id FROM chosen))
         INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data)
         SELECT c.id, 1, c.tenant, c.kind, c.at, c.data::jsonb
         FROM chosen c, pg_notify('",
        work_channel!(),
        "', 'created')
         ORDER BY c.ord
         RETURNING wait_id"
    ))
    .bind(&c.id)
    .bind(&c.tenant)
    .bind(&c.at)
    .bind(&c.deadline)
    .bind(&c.first_poll)
    .bind(&c.labels)
    .bind(&c.engine)
    .bind(&c.spec)
    .bind(&c.headers)
    .bind(&c.trace)
    .bind(&c.placement)
    .bind(&c.kind)
    .bind(&c.data)
    .bind(&c.key)
    .bind(&c.hash)
    .bind(&c.n_wait)
    .bind(&c.n_endpoint)
    .bind(&c.n_url)
    .bind(&c.n_kinds)
    .bind(&c.n_secret)
    .fetch_all(&pg.pool)
    .await?;
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

/// The batch's rows as arrays, one entry a create (and one a webhook for `n_*`).
#[derive(Default)]
struct Columns<'a> {
    id: Vec<Uuid>,
    tenant: Vec<&'a str>,
    at: Vec<DateTime<Utc>>,
    deadline: Vec<DateTime<Utc>>,
    first_poll: Vec<DateTime<Utc>>,
    labels: Vec<&'a str>,
    engine: Vec<&'a str>,
    spec: Vec<&'a str>,
    headers: Vec<&'a str>,
    trace: Vec<Option<&'a str>>,
    placement: Vec<Option<i64>>,
    kind: Vec<&'static str>,
    data: Vec<&'a str>,
    key: Vec<Option<&'a str>>,
    hash: Vec<Option<&'a str>>,
    n_wait: Vec<Uuid>,
    n_endpoint: Vec<i32>,
    n_url: Vec<&'a str>,
    n_kinds: Vec<i32>,
    n_secret: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn push(&mut self, r: &'a Row) {
        self.id.push(r.id);
        self.tenant.push(&r.tenant);
        self.at.push(r.now);
        self.deadline.push(r.deadline);
        self.first_poll.push(r.first_poll);
        self.labels.push(&r.labels);
        self.engine.push(&r.engine);
        self.spec.push(&r.spec);
        self.headers.push(&r.headers);
        self.trace.push(r.trace.as_deref());
        self.placement.push(r.placement);
        self.kind.push(r.kind);
        self.data.push(&r.data);
        self.key.push(r.key.as_ref().map(|(k, _)| k.as_str()));
        self.hash.push(r.key.as_ref().map(|(_, h)| h.as_str()));
        for (endpoint, url, kinds, secret) in &r.notify {
            self.n_wait.push(r.id);
            self.n_endpoint.push(*endpoint);
            self.n_url.push(url);
            self.n_kinds.push(*kinds);
            self.n_secret.push(secret);
        }
    }
}
