//! A request body over the limit is answered 413, and a client that writes the
//! whole body before it reads (Python's `http.client`, most simple clients) gets to
//! read that answer rather than a reset connection.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::App;

/// Two MiB: far over the API's 64 KiB, and more than the socket buffers hold, so
/// the server answers while the client is still writing.
const BODY: usize = 2 * 1024 * 1024;

/// Enough tries that a reset shows: without the lingering close, some of every
/// few dozen were reset on loopback.
const ATTEMPTS: usize = 100;

/// Writes a `POST /waits` with a `BODY`-byte body, all of it, then reads the
/// answer to its end: what arrived, or why nothing did.
fn post_whole_body_then_read(addr: &str) -> Result<String, String> {
    post_whole_then_read(addr, BODY)
}

/// [`post_whole_body_then_read`] of a body of `size` bytes.
fn post_whole_then_read(addr: &str, size: usize) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /waits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {size}\r\n\r\n"
    );
    s.write_all(head.as_bytes())
        .map_err(|e| format!("writing the head: {e}"))?;
    let chunk = vec![b' '; 64 * 1024];
    for _ in 0..size / chunk.len() {
        s.write_all(&chunk)
            .map_err(|e| format!("writing the body: {e}"))?;
    }
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .map_err(|e| format!("reading the answer: {e}"))?;
    Ok(String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test]
async fn a_client_that_writes_a_whole_oversize_body_before_reading_gets_the_413() {
    let app = App::start_args(support::test_args("sqlite::memory:")).await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let mut failures = Vec::new();
    for i in 0..ATTEMPTS {
        let addr = addr.clone();
        let answer = tokio::task::spawn_blocking(move || post_whole_body_then_read(&addr))
            .await
            .unwrap();
        match answer {
            Ok(a) if a.starts_with("HTTP/1.1 413") => {
                assert!(a.contains("application/problem+json"), "{a}");
                assert!(a.contains("64 KiB limit"), "{a}");
            }
            Ok(a) => failures.push(format!("request {i}: {a}")),
            Err(e) => failures.push(format!("request {i}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ATTEMPTS} did not read a 413:\n{}",
        failures.len(),
        failures.join("\n")
    );
    app.stop().await.0.unwrap();
}

/// The same at 100 MB, fifty times the body the socket buffers and a byte-counted
/// linger would have held: a client that writes it all reads the `413` as well.
#[tokio::test]
async fn a_client_that_writes_a_100_mb_body_before_reading_gets_the_413() {
    const HUGE: usize = 100 * 1024 * 1024;
    let app = App::start_args(support::test_args("sqlite::memory:")).await;
    let addr = app.base.trim_start_matches("http://").to_string();
    for i in 0..3 {
        let addr = addr.clone();
        let answer = tokio::task::spawn_blocking(move || post_whole_then_read(&addr, HUGE))
            .await
            .unwrap();
        match answer {
            Ok(a) => assert!(a.starts_with("HTTP/1.1 413"), "request {i}: {a}"),
            Err(e) => panic!("request {i}: {e}"),
        }
    }
    app.stop().await.0.unwrap();
}
