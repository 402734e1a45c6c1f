//! An OpenTelemetry collector on 127.0.0.1:0: `POST /v1/traces` takes an
//! OTLP/HTTP export, decodes it with the protocol's own protobuf types and keeps
//! its spans; [`Collector::hung`] accepts connections and never answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::net::TcpListener;

/// One span as the collector got it; ids in lowercase hex, as `traceparent`
/// writes them.
#[derive(Clone, Debug)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent: String,
    pub name: String,
    /// 1 internal, 2 server, 3 client.
    pub kind: i32,
    pub attributes: HashMap<String, String>,
    /// 0 unset, 2 error.
    pub status: i32,
    pub service: String,
}

impl Span {
    pub fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }
}

/// The collector. Cloning is shallow.
#[derive(Clone)]
pub struct Collector {
    pub base: String,
    spans: Arc<Mutex<Vec<Span>>>,
    /// The `Content-Type` of each export.
    content_types: Arc<Mutex<Vec<String>>>,
    heard: Arc<tokio::sync::Notify>,
}

type Shared = (
    Arc<Mutex<Vec<Span>>>,
    Arc<Mutex<Vec<String>>>,
    Arc<tokio::sync::Notify>,
);

impl Collector {
    pub async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let content_types = Arc::new(Mutex::new(Vec::new()));
        let heard = Arc::new(tokio::sync::Notify::new());
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(export))
            .with_state((spans.clone(), content_types.clone(), heard.clone()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Collector {
            base,
            spans,
            content_types,
            heard,
        }
    }

    /// A collector that takes every connection and never answers.
    pub async fn hung() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        Collector {
            base,
            spans: Arc::default(),
            content_types: Arc::default(),
            heard: Arc::default(),
        }
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    pub fn content_types(&self) -> Vec<String> {
        self.content_types.lock().unwrap().clone()
    }

    /// Whether `check` holds of the spans within `within`: woken by each export,
    /// not by a clock.
    pub async fn until(&self, within: Duration, check: impl Fn(&[Span]) -> bool) -> bool {
        super::heard_that(&self.heard, within, || check(&self.spans.lock().unwrap())).await
    }
}

async fn export(
    axum::extract::State((spans, content_types, heard)): axum::extract::State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    content_types.lock().unwrap().push(
        headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
    );
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut got = Vec::new();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(Span {
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent: hex::encode(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    attributes: s
                        .attributes
                        .iter()
                        .map(|kv| {
                            (
                                kv.key.clone(),
                                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                            )
                        })
                        .collect(),
                    status: s.status.map_or(0, |st| st.code),
                    service: service.clone(),
                });
            }
        }
    }
    spans.lock().unwrap().extend(got);
    heard.notify_waiters();
    StatusCode::OK
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}
