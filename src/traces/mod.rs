//! Traces: OpenTelemetry spans for API requests, polls, webhook attempts and every
//! outbound request (token mints among them), exported over OTLP/HTTP when an
//! endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`, or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); without one, nothing is made.
//!
//! - An API request's span is a server span, the child of the request's
//!   `traceparent` when it has one. The span of `POST /waits` is kept with the wait
//!   (its `traceparent`), and every poll of the wait is its child: on any replica,
//!   after any takeover.
//! - A poll's span says the wait, the attempt, the outcome and the status; each
//!   request it sends (to the target, to a token endpoint) is a client span under
//!   it, and the target receives that span as its `traceparent`.
//! - A webhook attempt's span is a child of its wait's trace; the receiver gets
//!   the attempt's request as its `traceparent`.
//!
//! Attributes never carry a URL's path or query, a header value or a body:
//! only hosts, statuses and ids.

mod export;

use std::sync::Arc;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tokio::sync::watch;
use uuid::Uuid;

pub use export::{QUEUE, SpanCounts};

use crate::config::SettingError;
use crate::engine::Observation;

/// The header a span's context travels in (W3C Trace Context).
pub const TRACEPARENT: &str = "traceparent";

/// Spans, when traces are exported; off, every method does nothing. Cheap to
/// clone.
#[derive(Clone, Default)]
pub struct Traces {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    tracer: SdkTracer,
    _provider: SdkTracerProvider,
    counts: Arc<SpanCounts>,
    stop: watch::Sender<bool>,
    exporting: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces").field("on", &self.is_on()).finish()
    }
}

/// Where the spans go: the OTLP/HTTP traces URL, from the settings or the
/// standard variables; `None` when traces are off.
pub fn endpoint(configured: Option<&str>) -> Result<Option<String>, SettingError> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
    {
        return Ok(None);
    }
    let url = match (var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), configured) {
        (Some(traces), _) => traces,
        (None, Some(base)) if !base.trim().is_empty() => {
            format!("{}/v1/traces", base.trim().trim_end_matches('/'))
        }
        _ => return Ok(None),
    };
    match url::Url::parse(url.trim()) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
            Ok(Some(u.to_string()))
        }
        _ => Err(SettingError(format!(
            "the OTLP endpoint \"{}\" is not an http:// or https:// URL; set \
             OTEL_EXPORTER_OTLP_ENDPOINT to the collector's address, such as \
             http://127.0.0.1:4318",
            url.escape_debug()
        ))),
    }
}

impl Traces {
    /// Traces off.
    pub fn off() -> Traces {
        Traces::default()
    }

    /// Spans exported to `url` (an OTLP/HTTP traces endpoint) over protobuf,
    /// with `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_EXPORTER_OTLP_TIMEOUT` as the
    /// standard says; the service is `waitd` unless `OTEL_SERVICE_NAME` names
    /// another. Starts the export task: call within the runtime.
    pub fn export_to(url: &str) -> Result<Traces, SettingError> {
        use opentelemetry_otlp::WithExportConfig as _;
        // The exporter's client is reqwest's, built with the process's provider.
        crate::engine::spec::tls::crypto_provider();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url)
            .build()
            .map_err(|e| SettingError(format!("cannot export traces to {url}: {e}")))?;
        Ok(Traces::with_exporter(exporter))
    }

    /// Spans handed to `exporter`, through the bounded queue.
    pub fn with_exporter<E: opentelemetry_sdk::trace::SpanExporter + 'static>(
        mut exporter: E,
    ) -> Traces {
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("waitd");
        }
        let resource = resource
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        // The exporter sends the resource with every batch.
        exporter.set_resource(&resource);
        let counts = Arc::new(SpanCounts::default());
        let (stop, stop_rx) = watch::channel(false);
        let (processor, task) = export::start(exporter, counts.clone(), stop_rx);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("waitd");
        Traces {
            inner: Some(Arc::new(Inner {
                tracer,
                _provider: provider,
                counts,
                stop,
                exporting: std::sync::Mutex::new(Some(task)),
            })),
        }
    }

    /// Whether spans are made.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// The counts of spans exported, dropped and failed, when traces are on.
    pub fn counts(&self) -> Option<Arc<SpanCounts>> {
        self.inner.as_ref().map(|i| i.counts.clone())
    }

    /// Exports what is queued (within a bound) and stops exporting.
    pub async fn stop(&self) {
        let Some(inner) = &self.inner else {
            return;
        };
        let _ = inner.stop.send(true);
        let task = inner.exporting.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    fn start(
        &self,
        name: &'static str,
        kind: SpanKind,
        parent: &Context,
        attributes: Vec<KeyValue>,
    ) -> Option<Context> {
        let inner = self.inner.as_ref()?;
        let span = inner
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&inner.tracer, parent);
        Some(parent.with_span(span))
    }

    /// The server span of an API request: `GET /waits/{id}` (the route, never
    /// the path), the child of the request's `traceparent` when it has one.
    pub fn request(
        &self,
        method: &http::Method,
        route: &str,
        headers: &http::HeaderMap,
    ) -> Option<Context> {
        self.inner.as_ref()?;
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let mut attributes = vec![KeyValue::new(
            "http.request.method",
            method.as_str().to_owned(),
        )];
        if !route.is_empty() {
            attributes.push(KeyValue::new("http.route", route.to_owned()));
        }
        let cx = self.start("request", SpanKind::Server, &parent, attributes)?;
        let name = if route.is_empty() {
            method.to_string()
        } else {
            format!("{method} {route}")
        };
        cx.span().update_name(name);
        Some(cx)
    }

    /// The span of one poll of `wait`, the child of the trace kept with the wait.
    pub fn poll(&self, trace: Option<&str>, wait: Uuid, attempt: u32) -> Option<Context> {
        self.inner.as_ref()?;
        let parent = parent_of(trace);
        self.start(
            "poll",
            SpanKind::Internal,
            &parent,
            vec![
                KeyValue::new("waitd.wait.id", wait.to_string()),
                KeyValue::new("waitd.poll.attempt", i64::from(attempt)),
            ],
        )
    }

    /// The span of one attempt at a delivery, the child of its wait's trace.
    pub fn webhook(
        &self,
        trace: Option<&str>,
        wait: Uuid,
        delivery: i64,
        attempt: i32,
    ) -> Option<Context> {
        self.inner.as_ref()?;
        let parent = parent_of(trace);
        self.start(
            "webhook attempt",
            SpanKind::Internal,
            &parent,
            vec![
                KeyValue::new("waitd.wait.id", wait.to_string()),
                KeyValue::new("waitd.delivery.id", delivery),
                KeyValue::new("waitd.delivery.attempt", i64::from(attempt)),
            ],
        )
    }

    /// The client span of one outbound request, the child of the current span
    /// (a poll's, a webhook attempt's), with its context put on the request as
    /// its `traceparent`.
    pub fn outbound<B>(&self, request: &mut http::Request<B>, peer: &str) -> Option<Context> {
        self.inner.as_ref()?;
        let mut attributes = vec![
            KeyValue::new("http.request.method", request.method().as_str().to_owned()),
            KeyValue::new("waitd.peer", peer.to_owned()),
        ];
        if let Some(host) = request.uri().host() {
            attributes.push(KeyValue::new("server.address", host.to_owned()));
        }
        if let Some(port) = request.uri().port_u16() {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        let cx = self.start(
            "outbound",
            SpanKind::Client,
            &Context::current(),
            attributes,
        )?;
        cx.span().update_name(request.method().to_string());
        TraceContextPropagator::new().inject_context(&cx, &mut HeadersMut(request.headers_mut()));
        Some(cx)
    }
}

/// The `traceparent` of a span's context, to keep with a wait.
pub fn traceparent(cx: &Context) -> Option<String> {
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    let mut one = One(None);
    TraceContextPropagator::new().inject_context(cx, &mut one);
    one.0
}

/// The context a kept `traceparent` stands for; none, or one that does not
/// parse, is a new trace.
fn parent_of(trace: Option<&str>) -> Context {
    match trace {
        Some(t) => TraceContextPropagator::new().extract(&One(Some(t.to_owned()))),
        None => Context::new(),
    }
}

/// Ends a server span with the response's status; a 5xx is an error.
pub fn responded(cx: &Context, status: http::StatusCode) {
    let span = cx.span();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status.as_u16()),
    ));
    if status.is_server_error() {
        span.set_status(Status::error(status.to_string()));
    }
    span.end();
}

/// Ends a client span with the answer's status, or why there is none.
pub fn answered(cx: &Context, outcome: Result<http::StatusCode, &dyn std::fmt::Display>) {
    let span = cx.span();
    match outcome {
        Ok(status) => {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status.as_u16()),
            ));
            if status.is_server_error() {
                span.set_status(Status::error(status.to_string()));
            }
        }
        Err(why) => {
            span.set_attribute(KeyValue::new("error.type", "request"));
            span.set_status(Status::error(why.to_string()));
        }
    }
    span.end();
}

/// Ends a poll's span with what the poll observed. Its status is the HTTP
/// status the answer had, recorded by [`status_seen`].
pub fn polled(cx: &Context, obs: &Observation, came: Option<&'static str>) {
    let span = cx.span();
    let (outcome, error) = match obs {
        Observation::State { .. } | Observation::Judged { .. } | Observation::Answered { .. } => {
            ("answered", None)
        }
        Observation::Missing { .. } => ("missing", None),
        Observation::NotFound { .. } => ("not_found", None),
        Observation::Transient { error, .. } => ("transient", Some(error)),
        Observation::Permanent { error } => ("permanent", Some(error)),
    };
    span.set_attribute(KeyValue::new("waitd.poll.outcome", outcome));
    if let Some(came) = came {
        span.set_attribute(KeyValue::new("waitd.poll.response", came));
    }
    if let Some(error) = error {
        span.set_status(Status::error(error.clone()));
    }
    span.end();
}

/// Ends a webhook attempt's span with the delivery's status after it.
pub fn attempted(cx: &Context, status: &str, code: Option<u16>, error: Option<&str>) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("waitd.delivery.status", status.to_owned()));
    if let Some(code) = code {
        span.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
    }
    if let Some(error) = error {
        span.set_status(Status::error(error.to_owned()));
    }
    span.end();
}

/// Records on the current span (a poll's) the HTTP status its answer had.
pub fn status_seen(status: http::StatusCode) {
    Context::map_current(|cx| {
        let span = cx.span();
        if span.is_recording() {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status.as_u16()),
            ));
        }
    });
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeadersMut<'a>(&'a mut http::HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// A `traceparent` alone, in and out.
struct One(Option<String>);

impl Extractor for One {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0.as_deref()).flatten()
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

impl Injector for One {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.0 = Some(value);
        }
    }
}
