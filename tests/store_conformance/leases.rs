//! Leases, against both databases: claims, renewals, checkpoints and releases,
//! and (on Postgres) what a checkpoint costs and how an old row is claimed.

use super::*;

#[tokio::test]
async fn a_claim_takes_a_lease_that_a_second_claimer_cannot_take_until_it_runs_out() {
    for_each_store!(|store, backend| {
        let w = store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let ttl = Duration::from_secs(30);
        let claimed = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "{}", backend.url());
        assert_eq!(
            claimed[0].spec.target.as_ref().unwrap().headers["Authorization"],
            "Bearer secret-token-value"
        );
        assert!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 10)
                .await
                .unwrap()
                .is_empty()
        );
        // The lease runs out: a renewal for no time at all leaves it ending now,
        // on the store's clock.
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        let taken = store
            .leases()
            .claim(b, ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(taken.len(), 1);
        assert!(taken[0].epoch > claimed[0].epoch);
        // The old owner is fenced off: its writes and renewals no longer land.
        let stale = Progress {
            id: w.id,
            epoch: claimed[0].epoch,
            engine: claimed[0].engine.clone(),
            next_poll_at: Some(Utc::now()),
            events: vec![EventBody::State {
                from: None,
                to: "x".into(),
            }],
            end: None,
        };
        assert!(!store.leases().record(a, Utc::now(), &stale).await.unwrap());
        let renew = [WaitEpoch::from((w.id, claimed[0].epoch))];
        assert_eq!(
            store
                .leases()
                .renew(a, ttl, &renew, &[])
                .await
                .unwrap()
                .lost,
            renew.to_vec()
        );
        let renew_b = [WaitEpoch::from((w.id, taken[0].epoch))];
        let renewal = store.leases().renew(b, ttl, &renew_b, &[]).await.unwrap();
        assert!(renewal.lost.is_empty() && renewal.strays.is_empty());
        assert_eq!(
            store
                .events()
                .of_wait("t", w.id, 0, 10)
                .await
                .unwrap()
                .len(),
            1,
            "the fenced write left no event"
        );
    });
}

#[tokio::test]
async fn concurrent_claimers_never_claim_the_same_wait() {
    for_each_store!(|store, backend| {
        for _ in 0..40 {
            store
                .waits()
                .create("t", &spec(), Utc::now(), None)
                .await
                .unwrap();
        }
        // The waits share one placement: one claimer's to take, until they are
        // overdue (§6.2) and the others race it for what is left.
        let claimed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let until = std::time::Instant::now() + Duration::from_secs(20);
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let s = store.clone();
            let claimed = claimed.clone();
            tasks.push(tokio::spawn(async move {
                use std::sync::atomic::Ordering::SeqCst;
                let me = Uuid::now_v7();
                let mut mine = Vec::new();
                while claimed.load(SeqCst) < 40 && std::time::Instant::now() < until {
                    let got: Vec<Uuid> = s
                        .leases()
                        .claim(me, Duration::from_secs(30), Duration::ZERO, 4)
                        .await
                        .unwrap()
                        .into_iter()
                        .map(|c| c.id)
                        .collect();
                    claimed.fetch_add(got.len(), SeqCst);
                    if got.is_empty() {
                        // Pacing: a claimer that got nothing claims again shortly.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    mine.extend(got);
                }
                mine
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(
            all.len(),
            n,
            "a wait was claimed twice on {}",
            backend.url()
        );
        assert_eq!(n, 40);
    });
}

#[tokio::test]
async fn a_renewal_keeps_every_wait_the_owner_holds_named_or_not() {
    for_each_store!(|store, backend| {
        let ttl = Duration::from_secs(30);
        let first = store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let held = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(held.len(), 1, "{}", backend.url());
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
        assert_eq!(
            store
                .leases()
                .claim(a, ttl, Duration::ZERO, 10)
                .await
                .unwrap()
                .len(),
            1
        );
        // The lease is at its end (a renewal for no time leaves it ending now, on
        // the store's clock) when a renewal that names only the first wait comes
        // (the second claim may still be on its way back to the worker): it keeps
        // both.
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        let renew = [WaitEpoch::from((first.id, held[0].epoch))];
        let renewal = store.leases().renew(a, ttl, &renew, &[]).await.unwrap();
        assert!(renewal.lost.is_empty());
        // The one it does not name is reported: owned, and not in the renewal (a
        // claim whose answer the worker never got would stay so).
        assert_eq!(renewal.strays.len(), 1, "{}", backend.url());
        assert_ne!(renewal.strays[0].id, first.id);
        assert!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 10)
                .await
                .unwrap()
                .is_empty(),
            "{}: a wait of a live owner was taken",
            backend.url()
        );
        // Without another renewal both go to the next claimer once the lease runs
        // out, and the old owner learns it.
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        assert_eq!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 10)
                .await
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            store
                .leases()
                .renew(a, ttl, &renew, &[])
                .await
                .unwrap()
                .lost,
            renew.to_vec()
        );
    });
}

#[tokio::test]
async fn released_leases_are_claimable_at_once_with_their_checkpoint() {
    for_each_store!(|store, backend| {
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
        let a = Uuid::now_v7();
        let c = store
            .leases()
            .claim(a, Duration::from_secs(60), Duration::ZERO, 1)
            .await
            .unwrap()
            .remove(0);
        let mut engine = c.engine.clone();
        engine.polls = 42;
        let next = Utc::now();
        let n = store
            .leases()
            .release(
                a,
                &[Checkpoint {
                    id: c.id,
                    epoch: c.epoch,
                    engine: Some(engine),
                    next_poll_at: Some(next),
                }],
            )
            .await
            .unwrap();
        assert_eq!(n, 1, "{}", backend.url());
        let again = store
            .leases()
            .claim(Uuid::now_v7(), Duration::from_secs(60), Duration::ZERO, 1)
            .await
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].engine.polls, 42);
        assert_eq!(
            store.waits().get("t", c.id).await.unwrap().unwrap().polls,
            42
        );
    });
}

#[tokio::test]
async fn a_checkpoint_renews_the_lease_and_lands_only_for_its_owner_and_when_newer() {
    for_each_store!(|store, backend| {
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let ttl = Duration::from_secs(30);
        let c = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 1)
            .await
            .unwrap()
            .remove(0);
        let at = |polls| {
            let mut engine = c.engine.clone();
            engine.polls = polls;
            Checkpoint {
                id: c.id,
                epoch: c.epoch,
                engine: Some(engine),
                next_poll_at: Some(Utc::now()),
            }
        };
        // Another replica's checkpoint lands nowhere.
        store.leases().checkpoint(b, ttl, &[at(9)]).await.unwrap();
        assert_eq!(
            store.waits().get("t", c.id).await.unwrap().unwrap().polls,
            0
        );
        store.leases().checkpoint(a, ttl, &[at(5)]).await.unwrap();
        assert_eq!(
            store.waits().get("t", c.id).await.unwrap().unwrap().polls,
            5,
            "{}",
            backend.url()
        );
        // An older one (a progress write got there first) does not go back.
        store.leases().checkpoint(a, ttl, &[at(3)]).await.unwrap();
        assert_eq!(
            store.waits().get("t", c.id).await.unwrap().unwrap().polls,
            5
        );
        // A checkpoint renews the lease: one with nothing in it, written when the
        // lease is at its end (a renewal for no time leaves it ending now, on the
        // store's clock), keeps the wait from the next claimer.
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        store.leases().checkpoint(a, ttl, &[]).await.unwrap();
        assert!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 1)
                .await
                .unwrap()
                .is_empty(),
            "{}: the lease ran out",
            backend.url()
        );
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        assert_eq!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 1)
                .await
                .unwrap()
                .len(),
            1,
            "{}: the lease did not run out",
            backend.url()
        );
    });
}

#[tokio::test]
async fn a_wait_given_back_is_claimed_when_its_checkpointed_poll_comes_not_before() {
    for_each_store!(|store, backend| {
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let ttl = Duration::from_secs(30);
        let c = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 1)
            .await
            .unwrap()
            .remove(0);
        let mut engine = c.engine.clone();
        engine.polls = 1;
        let later = Utc::now() + chrono::Duration::seconds(3600);
        let given_back = Checkpoint {
            id: c.id,
            epoch: c.epoch,
            engine: Some(engine),
            next_poll_at: Some(later),
        };
        assert_eq!(store.leases().release(a, &[given_back]).await.unwrap(), 1);
        // Due in an hour: not within a minute's lookahead, whatever order the
        // store claims by.
        assert!(
            store
                .leases()
                .claim(b, ttl, Duration::from_secs(60), 1)
                .await
                .unwrap()
                .is_empty(),
            "{}: claimed an hour before its next poll",
            backend.url()
        );
        let taken = store
            .leases()
            .claim(b, ttl, Duration::from_secs(7200), 1)
            .await
            .unwrap();
        assert_eq!(taken.len(), 1, "{}", backend.url());
        assert_eq!(taken[0].engine.polls, 1);
    });
}

/// On Postgres, a checkpoint of a held wait changes no indexed column, so it is a
/// HOT update: no index entries, a fraction of the WAL (docs/store.md §5.1). Adding an
/// index on a column a checkpoint writes would make every quiet poll cost about
/// three times as much, and fails this.
///
/// Postgres writes an update as HOT when no indexed column changes and the new
/// version fits on the old one's page. The second depends on pruning, which any
/// snapshot open in the database (an autovacuum ANALYZE, say) holds back; so the
/// table is rewritten first with a row a page, room for every version this writes,
/// and then every checkpoint is HOT exactly when it changes no indexed column.
#[tokio::test]
async fn on_postgres_a_checkpoint_of_a_held_wait_writes_no_index_entry() {
    let db = TestDb::new().await;
    let store = Store::open(&db.url, 4, Bus::new()).unwrap();
    store.migrate().await.unwrap();
    const N: usize = 40;
    const ROUNDS: u32 = 3;
    for _ in 0..N {
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
    }
    let a = Uuid::now_v7();
    let ttl = Duration::from_secs(30);
    let held = store
        .leases()
        .claim(a, ttl, Duration::ZERO, N as i64)
        .await
        .unwrap();
    assert_eq!(held.len(), N);
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    for sql in [
        "ALTER TABLE waits SET (fillfactor = 10, autovacuum_enabled = off)",
        "VACUUM FULL waits",
    ] {
        sqlx::query(sql).execute(&mut c).await.unwrap();
    }
    // A snapshot held open throughout, so nothing is pruned: the room is all there is.
    let mut snapshot = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    for sql in ["BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT 1"] {
        sqlx::query(sql).execute(&mut snapshot).await.unwrap();
    }
    for round in 1..=ROUNDS {
        for c in &held {
            let mut engine = c.engine.clone();
            engine.polls = round;
            let one = Checkpoint {
                id: c.id,
                epoch: c.epoch,
                engine: Some(engine),
                next_poll_at: Some(Utc::now() + chrono::Duration::seconds(60 * round as i64)),
            };
            store.leases().checkpoint(a, ttl, &[one]).await.unwrap();
        }
    }
    drop(snapshot);
    // A backend reports its table statistics when it exits at the latest.
    store.close().await;
    drop(store);
    let checkpoints = N as i64 * ROUNDS as i64;
    let c = tokio::sync::Mutex::new(c);
    let read = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'waits'",
        )
        .fetch_one(&mut *c.lock().await)
        .await
        .unwrap()
    };
    // Read until they are in: the statistics give no signal of their own.
    let counted = support::poll_for(Duration::from_secs(10), || async {
        let seen = read().await;
        (seen.0 >= N as i64 + checkpoints).then_some(seen)
    })
    .await;
    let (updates, hot) = match counted {
        Some(seen) => seen,
        None => read().await,
    };
    assert_eq!(
        updates,
        N as i64 + checkpoints,
        "the claims and the checkpoints"
    );
    // Each claim changes `owner` (indexed), so it is not HOT; every checkpoint is.
    assert_eq!(
        hot, checkpoints,
        "{hot} of {updates} updates were HOT: each of the {checkpoints} checkpoints should be"
    );
    drop(c);
    db.drop_db().await;
}

/// A replica of the version before `claim_at` existed inserts waits without it. In a
/// rolling upgrade those must still be claimed once only current replicas run
/// (migration 0008).
#[tokio::test]
async fn on_postgres_a_wait_inserted_without_a_claim_order_is_claimed() {
    let db = TestDb::new().await;
    let store = Store::open(&db.url, 4, Bus::new()).unwrap();
    store.migrate().await.unwrap();
    let made = store
        .waits()
        .create("t", &spec(), Utc::now(), None)
        .await
        .unwrap();
    let old = made.wait.id;
    let new = Uuid::now_v7();
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    // The previous version's insert, column for column, of a copy of the wait.
    for sql in [
        "INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq)
         SELECT $2, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq
         FROM waits WHERE id = $1",
        "INSERT INTO wait_specs (wait_id, spec, headers) SELECT $2, spec, headers FROM wait_specs WHERE wait_id = $1",
    ] {
        sqlx::query(sql).bind(old).bind(new).execute(&mut c).await.unwrap();
    }
    let (claim_at, next_poll_at): (Option<DateTime<Utc>>, DateTime<Utc>) =
        sqlx::query_as("SELECT claim_at, next_poll_at FROM waits WHERE id = $1")
            .bind(new)
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(
        claim_at,
        Some(next_poll_at),
        "its claim order is its next poll"
    );
    let a = Uuid::now_v7();
    let taken = store
        .leases()
        .claim(a, Duration::from_secs(30), Duration::ZERO, 10)
        .await
        .unwrap();
    let mut ids: Vec<Uuid> = taken.iter().map(|t| t.id).collect();
    ids.sort();
    let mut want = vec![old, new];
    want.sort();
    assert_eq!(
        ids, want,
        "both the wait and its copy inserted the old way are claimed"
    );
    store.close().await;
    drop(c);
    db.drop_db().await;
}

/// A backlog (a claim of more than 1,000) is taken in the order the waits lie in
/// the table, not the order they fall due: every wait due within the lookahead is
/// claimed once, none due later, and of two replicas alive each takes only the
/// waits its placement gives it.
#[tokio::test]
async fn on_postgres_a_backlog_is_claimed_whole_once_and_by_placement() {
    let db = TestDb::new().await;
    let store = Store::open(&db.url, 4, Bus::new()).unwrap();
    store.migrate().await.unwrap();
    let seed = store
        .waits()
        .create("t", &spec(), Utc::now(), None)
        .await
        .unwrap()
        .wait
        .id;
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    // 2,600 copies due over the next 50 s, inserted in an order unrelated to when
    // they fall due (as an import or a benchmark leaves them), each with its own
    // placement; and 50 due in five minutes, past the lookahead.
    for sql in [
        "UPDATE waits SET claim_at = now() + interval '10 minutes', next_poll_at = now() + interval '10 minutes'
         WHERE id = $1",
        "INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, claim_at, labels, engine, seq, placement)
         SELECT gen_random_uuid(), w.tenant, 'running', w.created_at, w.updated_at, w.deadline, d.due, d.due, w.labels, w.engine, 1, d.i
         FROM waits w,
              (SELECT * FROM
                 (SELECT i, now() + interval '3 s' + random() * interval '47 s' AS due FROM generate_series(1, 2600) i
                  UNION ALL
                  SELECT i, now() + interval '5 minutes' FROM generate_series(2601, 2650) i) u
               ORDER BY random()) d
         WHERE w.id = $1",
        "INSERT INTO wait_specs (wait_id, spec, headers)
         SELECT w.id, s.spec, s.headers FROM waits w, wait_specs s
         WHERE s.wait_id = $1 AND w.id <> $1",
    ] {
        sqlx::query(sql).bind(seed).execute(&mut c).await.unwrap();
    }
    let ttl = Duration::from_secs(30);
    let lookahead = Duration::from_secs(60);
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    store.leases().renew_lease(a, ttl).await.unwrap();
    store.leases().renew_lease(b, ttl).await.unwrap();
    // A replica's first claim takes any wait: both make their slots with a claim
    // of nothing (none is due yet).
    for owner in [a, b] {
        let first = store.leases().claim(owner, ttl, Duration::ZERO, 10);
        assert!(first.await.unwrap().is_empty());
    }
    // Each claims as the worker does: 2,000 at a time after a full claim (a
    // backlog), 1,000 otherwise, until nothing is left for it.
    let mut taken: Vec<(Uuid, Uuid)> = Vec::new();
    for owner in [a, b] {
        let mut limit = 2000;
        loop {
            let claimed = store
                .leases()
                .claim(owner, ttl, lookahead, limit)
                .await
                .unwrap();
            if claimed.is_empty() {
                break;
            }
            limit = if claimed.len() >= 1000 { 2000 } else { 1000 };
            taken.extend(claimed.into_iter().map(|c| (c.id, owner)));
        }
    }
    let ids: Vec<Uuid> = taken.iter().map(|(id, _)| *id).collect();
    let rows: Vec<(Uuid, i64, bool)> = sqlx::query_as(
        "SELECT id, placement, claim_at <= now() + interval '60 s' FROM waits WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert!(
        rows.iter().all(|(_, _, due)| *due),
        "a wait due later was claimed"
    );
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "a wait was claimed twice");
    assert_eq!(
        ids.len(),
        2600,
        "every wait due within the lookahead is claimed"
    );
    // Placement modulo the replicas alive, against each one's rank by id.
    let rank = |owner: Uuid| if owner == a.min(b) { 0 } else { 1 };
    for (id, placement, _) in &rows {
        let owner = taken.iter().find(|(t, _)| t == id).unwrap().1;
        assert_eq!(placement % 2, rank(owner), "{id} went to the other replica");
    }
    store.close().await;
    drop(c);
    db.drop_db().await;
}
