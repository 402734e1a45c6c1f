//! Connections that find no room: the `429` an address at its cap is answered
//! with, and the one warning a flood of connections closed or refused to make
//! room comes to, rather than a line each.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::Limits;
use super::registry::Address;

/// Refused connections kept open at once until their clients close; past it, a
/// refused connection is closed as soon as its answer is written, so a flood of
/// them costs no more file descriptors than this.
pub(super) const REFUSALS_AT_ONCE: usize = 32;

/// How long a refused client has to read its answer and close.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// Answers a connection from an address at its cap with a 429 and closes it.
/// The answer goes out before the request is read (HTTP/1.1 lets a server answer
/// early). A socket closed with unread data resets the connection, and the client
/// may then never read the answer: so what the client has sent is read first, and,
/// while fewer than [`REFUSALS_AT_ONCE`] are, until the client closes.
pub(super) fn refuse(stream: TcpStream, refusals: &Arc<Semaphore>) {
    use std::io::{Read, Write};
    let Ok(mut stream) = stream.into_std() else {
        return;
    };
    let body = concat!(
        r#"{"type":"/problems/too-many-connections","title":"Too many connections","#,
        r#""status":429,"detail":"this address has as many connections open as waitd allows one address; "#,
        r#"reuse an open connection, or close one and try again"}"#
    );
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/problem+json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // The socket is non-blocking: these read what has arrived and write what fits,
    // which on a new connection is all of the answer.
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        if !matches!(stream.read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
    let _ = stream.write(answer.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let Ok(mut stream) = TcpStream::from_std(stream) else {
            return;
        };
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
}

/// Counts of connections closed or refused to make room, logged at most every
/// 10 s so that a flood of them is one line, not one each.
#[derive(Default)]
pub(super) struct Crowding {
    pub closed: u64,
    pub refused: u64,
    pub refused_last: Option<Address>,
    logged: Option<Instant>,
}

impl Crowding {
    /// When the counts not yet logged are due to be, if there are any.
    pub(super) fn due(&self) -> Option<Instant> {
        (self.closed + self.refused > 0).then(|| {
            self.logged
                .map_or_else(Instant::now, |t| t + Duration::from_secs(10))
        })
    }

    pub(super) fn report(&mut self, limits: &Limits) {
        if self.due().is_none_or(|t| t > Instant::now()) {
            return;
        }
        tracing::warn!(
            max_connections = limits.max_connections,
            per_address = limits.per_address.unwrap_or(0),
            closed_idle = self.closed,
            refused = self.refused,
            refused_last = %self.refused_last.map_or_else(String::new, |a| a.to_string()),
            "connections are crowding in: idle ones were closed to make room for new ones, \
             and new ones from an address at its cap with none idle were refused"
        );
        *self = Crowding {
            logged: Some(Instant::now()),
            ..Crowding::default()
        };
    }
}
