//! Opening the store, against both databases: what it keeps across a reopen,
//! and what it refuses to open.

use super::*;

#[tokio::test]
async fn waits_and_events_persist_across_a_reopen() {
    for backend in backends().await {
        let store = backend.open().await;
        let w = store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        store.close().await;
        drop(store);
        let reopened = backend.open().await;
        let back = reopened
            .waits()
            .get("t", w.id)
            .await
            .unwrap()
            .expect("persisted");
        assert_eq!(back.id, w.id, "{}", backend.url());
        assert_eq!(
            reopened
                .events()
                .of_wait("t", w.id, 0, 10)
                .await
                .unwrap()
                .len(),
            1
        );
        reopened.close().await;
        drop(reopened);
        backend.finish().await;
    }
}

#[tokio::test]
async fn a_second_process_on_the_same_sqlite_file_is_refused_with_a_clear_message() {
    let dir = support::TempDir::new("waitd-test");
    let url = dir.sqlite_url();
    let first = Store::open(&url, 1, Bus::new()).unwrap();
    first.migrate().await.unwrap();
    let second = Store::open(&url, 1, Bus::new());
    let err = second.expect_err("the file is locked").to_string();
    assert!(err.contains("another waitd is already using"), "{err}");
    first.close().await;
    drop(first);
    // Once the first has gone, the file can be opened again.
    assert!(Store::open(&url, 1, Bus::new()).is_ok());
}

#[tokio::test]
async fn a_bad_database_url_is_refused_naming_the_problem() {
    let err = Store::open("mysql://x", 1, Bus::new())
        .unwrap_err()
        .to_string();
    assert!(err.contains("mysql"), "{err}");
    let err = Store::open("sqlite:///no/such/dir/waitd.db", 1, Bus::new())
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
}
