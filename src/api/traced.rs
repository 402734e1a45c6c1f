//! The server span of each API request ([`crate::traces`]), the child of the
//! request's `traceparent`; the span of `POST /waits` is the parent of the
//! wait's polls, so the handler keeps its `traceparent` with the wait.

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::Context;
use opentelemetry::context::FutureExt as _;

use crate::traces::{self, Traces};

/// The span of the request being served, for a handler that keeps it.
#[derive(Clone)]
pub struct RequestTrace(Context);

impl RequestTrace {
    /// Its `traceparent`, to keep with a wait.
    pub fn traceparent(&self) -> Option<String> {
        traces::traceparent(&self.0)
    }
}

/// Serves the request within its span, and ends the span with the status.
pub(super) async fn trace_request(
    State(traces): State<Traces>,
    mut req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let Some(cx) = traces.request(req.method(), &route, req.headers()) else {
        return next.run(req).await;
    };
    req.extensions_mut().insert(RequestTrace(cx.clone()));
    let res = next.run(req).with_context(cx.clone()).await;
    traces::responded(&cx, res.status());
    res
}
