//! A `grpc://host:port[/service]` target: one call of the gRPC health checking
//! protocol's `grpc.health.v1.Health/Check` a poll, over HTTP/2 without TLS, on a
//! connection made as for `tcp://` (the SSRF guard's resolver, the per-host
//! limit, the probe timeout over the whole call). Its state is the serving status
//! the server answers; conditions see it as the map `grpc`.
//!
//! The request and the response are one protobuf field each (`service`, a
//! string; `status`, an enum), so they are written and read here rather than
//! through a protobuf crate; the response is read up to [`MAX_MESSAGE`] bytes.

use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::connection::{Conn, Probed};
use super::refusal;
use super::tcp::{Outcome, host_port, state};
use crate::engine::Observation;
use crate::engine::condition::Field;

/// The health checking protocol's method.
const CHECK: &str = "/grpc.health.v1.Health/Check";
/// The most bytes of a response's body read: a `HealthCheckResponse` is two.
pub const MAX_MESSAGE: usize = 1024;

/// The serving statuses of `grpc.health.v1.HealthCheckResponse`, by number.
const STATUSES: [&str; 4] = ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"];

/// What one call came to, short of the connection.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// The server answered with this serving status.
    Status(&'static str),
    /// The call ended with a gRPC status other than OK: its code and message.
    Refused { code: u32, message: String },
    /// The answer was not a health check's: a sentence saying how.
    Broken(String),
}

impl super::Prober {
    /// One health check of a `grpc://` target, not yet judged by a wait's
    /// conditions.
    pub(super) async fn grpc_probed(&self, wait: uuid::Uuid, c: &Conn<'_>) -> Probed {
        let (host, port) = host_port(c.uri);
        let service = c.uri.path().trim_start_matches('/').to_string();
        let _slot = self.inner.hosts.acquire(c.host.clone()).await;
        self.inner
            .shares
            .counts
            .sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        let seen = self.connect(&host, port).await;
        let transient = |error: String| {
            Probed::bare(Observation::Transient {
                error,
                retry_after: None,
            })
        };
        let stream = match seen.outcome {
            Outcome::Connected(stream) => stream,
            Outcome::Refused => return transient(format!("{host}:{port} refused the connection")),
            Outcome::Failed(error) => return transient(error),
            Outcome::Forbidden(error) => return Probed::bare(refusal(wait, &host, error)),
        };
        let left = self.inner.timeout.saturating_sub(started.elapsed());
        let answer = match tokio::time::timeout(left, check(stream, &service)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => Answer::Broken(error),
            Err(_) => Answer::Broken(format!(
                "the health check of {host}:{port} was not answered within {}s",
                self.inner.timeout.as_secs_f64()
            )),
        };
        let elapsed = started.elapsed();
        Probed {
            base: observation(&answer, &host, port),
            kind: "grpc",
            fields: Some(fields(&answer, seen.address, elapsed)),
            elapsed,
        }
    }
}

/// The observation an answer makes: its serving status as the state; a service
/// the server does not know (`NOT_FOUND`) as `SERVICE_UNKNOWN`, progress like
/// the others; a server without the health service as permanent; anything else
/// worth trying again.
pub fn observation(answer: &Answer, host: &str, port: u16) -> Observation {
    match answer {
        Answer::Status(s) => state(s),
        Answer::Refused { code: 5, .. } => state("SERVICE_UNKNOWN"),
        Answer::Refused { code: 12, .. } => Observation::Permanent {
            error: format!(
                "{host}:{port} does not implement the gRPC health checking protocol (grpc.health.v1.Health answered UNIMPLEMENTED)"
            ),
        },
        Answer::Refused { code, message } => Observation::Transient {
            error: format!(
                "the health check of {host}:{port} ended with gRPC status {code}{}",
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            ),
            retry_after: None,
        },
        Answer::Broken(error) => Observation::Transient {
            error: error.clone(),
            retry_after: None,
        },
    }
}

fn fields(
    answer: &Answer,
    address: Option<std::net::SocketAddr>,
    elapsed: Duration,
) -> Vec<(&'static str, Field)> {
    let (status, code, error) = match answer {
        Answer::Status(s) => (Field::Text((*s).into()), Field::Int(0), Field::Null),
        Answer::Refused { code, message } => (
            if *code == 5 {
                Field::Text("SERVICE_UNKNOWN".into())
            } else {
                Field::Null
            },
            Field::Int(i64::from(*code)),
            Field::Text(message.clone()),
        ),
        Answer::Broken(e) => (Field::Null, Field::Null, Field::Text(e.clone())),
    };
    vec![
        ("status", status),
        ("code", code),
        ("elapsed", Field::Duration(elapsed)),
        (
            "address",
            address.map_or(Field::Null, |a| Field::Text(a.to_string())),
        ),
        ("error", error),
    ]
}

/// One `Check` call on `stream` for `service` ("" for the server as a whole).
async fn check(stream: tokio::net::TcpStream, service: &str) -> Result<Answer, String> {
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("the HTTP/2 handshake failed: {e}"))?;
    // The connection is driven beside the call and dropped with it.
    let driver = tokio::spawn(conn);
    let _abort = AbortOnDrop(driver);
    let request = http::Request::post(format!("http://grpc{CHECK}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, super::USER_AGENT)
        .body(Full::new(request_message(service)))
        .map_err(|e| format!("the health check could not be written: {e}"))?;
    let response = send
        .send_request(request)
        .await
        .map_err(|e| format!("the health check was not answered: {e}"))?;
    let (parts, body) = response.into_parts();
    if parts.status != http::StatusCode::OK {
        return Ok(Answer::Broken(format!(
            "the server answered the health check with HTTP {}, not a gRPC answer",
            parts.status.as_u16()
        )));
    }
    // A trailers-only answer carries its status in the headers.
    if let Some(code) = grpc_status(&parts.headers) {
        return Ok(refused_or_ok(code, &parts.headers, None));
    }
    let collected = Limited::new(body, MAX_MESSAGE)
        .collect()
        .await
        .map_err(|e| {
            format!(
                "the health check's answer could not be read (at most {MAX_MESSAGE} bytes): {e}"
            )
        })?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let message = collected.to_bytes();
    match grpc_status(&trailers) {
        Some(0) => Ok(read_response(&message)),
        Some(code) => Ok(refused_or_ok(code, &trailers, Some(&message))),
        None => Ok(Answer::Broken(
            "the health check's answer ended without a grpc-status".into(),
        )),
    }
}

fn refused_or_ok(code: u32, headers: &http::HeaderMap, message: Option<&Bytes>) -> Answer {
    if code == 0 {
        return message.map_or_else(
            || Answer::Broken("the health check's answer carried no message".into()),
            |m| read_response(m),
        );
    }
    let text = headers
        .get("grpc-message")
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
        .unwrap_or_default();
    Answer::Refused {
        code,
        message: crate::engine::bound::text(&text, crate::engine::bound::MAX_QUOTED).into_owned(),
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A length-prefixed `HealthCheckRequest { service }`.
pub fn request_message(service: &str) -> Bytes {
    let mut proto = Vec::with_capacity(service.len() + 4);
    if !service.is_empty() {
        proto.push(0x0a); // field 1, length-delimited
        varint(service.len() as u64, &mut proto);
        proto.extend_from_slice(service.as_bytes());
    }
    let mut framed = Vec::with_capacity(proto.len() + 5);
    framed.push(0); // not compressed
    framed.extend_from_slice(&(proto.len() as u32).to_be_bytes());
    framed.extend_from_slice(&proto);
    Bytes::from(framed)
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Reads one length-prefixed `HealthCheckResponse`: its `status` (field 1), any
/// other field skipped; a status of `UNKNOWN` (0) is also what an empty message
/// means.
pub fn read_response(framed: &[u8]) -> Answer {
    let broken = |why: &str| Answer::Broken(format!("the health check's answer {why}"));
    let mut b = framed;
    if b.len() < 5 {
        return broken("is shorter than a gRPC message's 5-byte prefix");
    }
    if b.get_u8() != 0 {
        return broken("is compressed, which waitd does not ask for");
    }
    let len = b.get_u32() as usize;
    if len != b.len() {
        return broken("is not one whole message");
    }
    let mut status = 0u64;
    while b.has_remaining() {
        let Some(key) = read_varint(&mut b) else {
            return broken("is not a protobuf message");
        };
        let ok = match key & 7 {
            0 => match read_varint(&mut b) {
                Some(v) if key >> 3 == 1 => {
                    status = v;
                    true
                }
                Some(_) => true,
                None => false,
            },
            1 => skip(&mut b, 8),
            2 => read_varint(&mut b).is_some_and(|n| skip(&mut b, n as usize)),
            5 => skip(&mut b, 4),
            _ => false,
        };
        if !ok {
            return broken("is not a protobuf message");
        }
    }
    match STATUSES.get(status as usize) {
        Some(s) => Answer::Status(s),
        None => broken(&format!(
            "has a serving status ({status}) the protocol does not define"
        )),
    }
}

fn read_varint(b: &mut &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        if !b.has_remaining() {
            return None;
        }
        let byte = b.get_u8();
        n |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(n);
        }
    }
    None
}

fn skip(b: &mut &[u8], n: usize) -> bool {
    if b.remaining() < n {
        return false;
    }
    b.advance(n);
    true
}

struct AbortOnDrop(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_its_service_and_a_response_reads_its_status() {
        assert_eq!(&request_message("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(
            &request_message("a.B")[..],
            &[0, 0, 0, 0, 5, 0x0a, 3, b'a', b'.', b'B']
        );
        assert_eq!(
            read_response(&[0, 0, 0, 0, 2, 0x08, 1]),
            Answer::Status("SERVING")
        );
        assert_eq!(read_response(&[0, 0, 0, 0, 0]), Answer::Status("UNKNOWN"));
        // An unknown field is skipped.
        assert_eq!(
            read_response(&[0, 0, 0, 0, 5, 0x12, 1, b'x', 0x08, 2]),
            Answer::Status("NOT_SERVING")
        );
        for bad in [
            &[0u8, 0, 0, 0][..],
            &[1, 0, 0, 0, 2, 0x08, 1],
            &[0, 0, 0, 0, 3, 0x08, 1],
            &[0, 0, 0, 0, 2, 0x08, 9],
            &[0, 0, 0, 0, 2, 0x0a, 5],
            &[
                0, 0, 0, 0, 11, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ],
        ] {
            assert!(matches!(read_response(bad), Answer::Broken(_)), "{bad:?}");
        }
    }
}
