//! Connections that hold slots without using them (§6.9): idle ones cannot keep a
//! new client out, one address holds at most its share, and a connection that
//! says nothing is closed after the first-header timeout. The clients connect from
//! different loopback addresses (all of 127/8 is this host) to stand for different
//! machines.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use support::{App, TestDb};

const TOKEN: &str = "token-of-tenant-a-0001";

const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

fn list_waits() -> String {
    format!(
        "GET /waits HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )
}

/// A create whose body never arrives: a request in flight until the body timeout.
fn stalled_create(bearer: bool) -> String {
    let auth = if bearer {
        format!("Authorization: Bearer {TOKEN}\r\n")
    } else {
        String::new()
    };
    format!(
        "POST /waits HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"ta"
    )
}

fn addr(app: &App) -> SocketAddr {
    app.base.trim_start_matches("http://").parse().unwrap()
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// Sends `request` on a new connection from `from` and reads until the server
/// closes: the answer, and how long it took from connecting.
async fn ask(from: &str, to: SocketAddr, request: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut s = connect_from(from, to).await;
    s.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("answered within 10 s")
        .unwrap();
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test]
async fn idle_connections_holding_every_slot_cannot_keep_a_health_check_or_a_tenant_out() {
    let db = TestDb::new().await;
    let tokens = format!("a:{TOKEN}");
    // No per-address cap, so that one address can take every slot, as it could
    // before there was one.
    let app = App::start_with(
        &db,
        &[
            "--tokens",
            &tokens,
            "--max-connections",
            "16",
            "--max-connections-per-address",
            "0",
            "--first-header-timeout",
            "3s",
        ],
    )
    .await;
    let to = addr(&app);
    let mut idle = Vec::new();
    for _ in 0..16 {
        idle.push(connect_from("127.0.0.1", to).await);
    }
    // The server accepts in the order the connections were made, so the idle ones
    // hold every slot before the next connection is looked at. They are all under a
    // second old: the first to be given up is given up when it turns one.
    let (health, took) = ask("127.0.0.1", to, HEALTHZ).await;
    eprintln!("/healthz with 16 idle connections holding all 16 slots: {took:?}");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let (listed, took) = ask("127.0.0.1", to, &list_waits()).await;
    eprintln!("GET /waits, authenticated, on a new connection, likewise: {took:?}");
    assert!(listed.starts_with("HTTP/1.1 200"), "{listed}");
    assert!(took < Duration::from_secs(2), "{took:?}");

    // Two idle connections were closed for those two; the rest are closed at the
    // first-header timeout.
    let started = Instant::now();
    for s in &mut idle {
        assert!(support::closes_within(s, Duration::from_secs(10)).await);
    }
    eprintln!("every idle connection closed {:?} later", started.elapsed());
    let (health, took) = ask("127.0.0.1", to, HEALTHZ).await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn one_address_holds_at_most_half_the_slots_and_past_that_is_refused_with_a_429() {
    let db = TestDb::new().await;
    let tokens = format!("a:{TOKEN}");
    let app = App::start_with(
        &db,
        &[
            "--tokens",
            &tokens,
            "--max-connections",
            "16",
            "--body-timeout",
            "20s",
        ],
    )
    .await;
    let to = addr(&app);
    // Eight requests in flight from one address: its share of sixteen.
    let mut busy = Vec::new();
    for _ in 0..8 {
        let mut s = connect_from("127.0.0.3", to).await;
        s.write_all(stalled_create(true).as_bytes()).await.unwrap();
        busy.push(s);
    }
    let (refused, took) = ask("127.0.0.3", to, HEALTHZ).await;
    eprintln!("a ninth connection from the same address: refused in {took:?}");
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(refused.contains("application/problem+json"), "{refused}");
    assert!(refused.contains("this address"), "{refused}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    let (health, took) = ask("127.0.0.2", to, HEALTHZ).await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(took < Duration::from_secs(1), "{took:?}");

    // Another address fills the other half with idle connections: a third still
    // gets in, in place of one of them.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(connect_from("127.0.0.4", to).await);
    }
    let (health, took) = ask("127.0.0.2", to, HEALTHZ).await;
    eprintln!("/healthz with 8 requests in flight and 8 idle connections: {took:?}");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let mut closed = 0;
    for s in &mut idle {
        closed += usize::from(support::closes_within(s, Duration::from_millis(100)).await);
    }
    assert_eq!(closed, 1, "only one idle connection is given up");
    drop(busy);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn when_every_connection_has_a_request_in_flight_a_new_one_waits_until_one_ends() {
    let db = TestDb::new().await;
    let app = App::start_with(
        &db,
        &[
            "--max-connections",
            "4",
            "--max-connections-per-address",
            "0",
        ],
    )
    .await;
    let to = addr(&app);
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut s = connect_from("127.0.0.1", to).await;
        s.write_all(stalled_create(false).as_bytes()).await.unwrap();
        busy.push(s);
    }
    let mut extra = connect_from("127.0.0.2", to).await;
    extra.write_all(HEALTHZ.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 512];
    let early = tokio::time::timeout(Duration::from_millis(1500), extra.read(&mut buf)).await;
    assert!(early.is_err(), "answered past the cap");
    // Ending one request lets it in.
    drop(busy.pop());
    let n = tokio::time::timeout(Duration::from_secs(3), extra.read(&mut buf))
        .await
        .expect("answered once a request ended")
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop(busy);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_at_the_first_header_timeout_and_a_kept_one_at_the_header_timeout()
 {
    let db = TestDb::new().await;
    let app = App::start_with(
        &db,
        &["--first-header-timeout", "300ms", "--header-timeout", "5s"],
    )
    .await;
    let to = addr(&app);
    let mut silent = connect_from("127.0.0.1", to).await;
    let started = Instant::now();
    assert!(support::closes_within(&mut silent, Duration::from_secs(3)).await);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(250), "{took:?}");

    let mut kept = connect_from("127.0.0.1", to).await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        !support::closes_within(&mut kept, Duration::from_secs(1)).await,
        "a keep-alive connection closed before the header timeout"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A stream holds its connection busy, so streams are held to half the slots and
/// one tenant's to a quarter, whatever `--max-streams-per-tenant` says: a tenant
/// opening streams from many addresses is refused with a 429 past its share, and a
/// new client still gets in.
#[tokio::test]
async fn one_tenants_streams_hold_at_most_a_quarter_of_the_slots() {
    let db = TestDb::new().await;
    let tokens = format!("a:{TOKEN}");
    let app = App::start_with(
        &db,
        &[
            "--tokens",
            &tokens,
            "--max-connections",
            "16",
            "--max-streams-per-tenant",
            "1000",
        ],
    )
    .await;
    let to = addr(&app);
    let follow = format!(
        "GET /events?follow=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    );
    let mut open = Vec::new();
    let mut refused = 0;
    for i in 0..8 {
        let mut s = connect_from(&format!("127.0.1.{}", i + 1), to).await;
        s.write_all(follow.as_bytes()).await.unwrap();
        let mut head = vec![0u8; 12];
        s.read_exact(&mut head).await.unwrap();
        let head = String::from_utf8_lossy(&head).to_string();
        if head.starts_with("HTTP/1.1 200") {
            open.push(s);
        } else {
            assert!(head.starts_with("HTTP/1.1 429"), "{head}");
            refused += 1;
        }
    }
    assert_eq!((open.len(), refused), (4, 4), "a quarter of 16 slots");
    let (health, took) = ask("127.0.0.2", to, HEALTHZ).await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    drop(open);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
