//! One app on each store, for the tests that run the same body on Postgres and
//! on SQLite: [`each_store`], then [`finish`] each.

use super::{App, TempDir, TestDb, test_args};

/// What keeps an app's database alive: a fresh Postgres database (dropped by
/// [`finish`]), or a SQLite file in a directory removed when it is dropped.
pub enum Backend {
    Postgres(TestDb),
    Sqlite(#[allow(dead_code)] TempDir),
}

/// A running app on each store, Postgres first, started with the flags `args`
/// makes of a database URL ([`test_args`] and what the test adds).
pub async fn each_store_with(args: impl Fn(&str) -> Vec<String>) -> Vec<(App, Backend)> {
    let db = TestDb::new().await;
    let pg = App::start_args(args(&db.url)).await;
    let dir = TempDir::new("waitd-stores");
    let lite = App::start_args(args(&dir.sqlite_url())).await;
    vec![(pg, Backend::Postgres(db)), (lite, Backend::Sqlite(dir))]
}

/// A running app on each store, with the usual flags.
pub async fn each_store() -> Vec<(App, Backend)> {
    each_store_with(test_args).await
}

/// Stops the app (it must stop cleanly) and drops its database.
pub async fn finish(app: App, backend: Backend) {
    let (stopped, _) = app.stop().await;
    assert!(stopped.is_ok());
    if let Backend::Postgres(db) = backend {
        db.drop_db().await;
    }
}
