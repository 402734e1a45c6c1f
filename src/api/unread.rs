//! `Connection: close` on every answer given before its request's body was read to
//! its end (a `413` or `415` refused before reading, a heartbeat that reads no
//! body, a `401` before the handler). The HTTP layer then cannot keep the
//! connection alive and closes it after the answer (lingering, `src/linger.rs`);
//! saying so keeps a client that pools connections from sending its next request
//! on the closed one, where it would get no answer at all.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::response::Response;

/// The middleware: a request with a body gets it wrapped so that its end is
/// noticed; an answer given before that end says `Connection: close`.
pub(super) async fn close_unread(req: Request, next: axum::middleware::Next) -> Response {
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let ended = Arc::new(AtomicBool::new(false));
    let (parts, body) = req.into_parts();
    let body = Body::new(Watched {
        inner: body,
        ended: Arc::clone(&ended),
    });
    let mut res = next.run(Request::from_parts(parts, body)).await;
    if !ended.load(Ordering::Relaxed) {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// A request body that records when it has been read to its end.
struct Watched {
    inner: Body,
    ended: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
