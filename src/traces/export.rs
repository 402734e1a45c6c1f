//! Spans on their way out: a bounded queue between the spans that end and the
//! OTLP exporter, so a collector that is down or slow costs at most
//! [`QUEUE`] spans of memory, and what does not fit is dropped and counted.
//!
//! Not the SDK's batch processor: it drops as this does, but only logs how many,
//! and an operator needs the count as a metric (`waitd_trace_spans_total`).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, watch};

/// The most spans waiting to be exported; more are dropped.
pub const QUEUE: usize = 2048;

/// The most spans one export carries.
const BATCH: usize = 512;

/// How long the exporter gathers spans after the first of a batch, so that a
/// busy replica sends a few large requests rather than many small ones.
const GATHER: Duration = Duration::from_millis(500);

/// How long the spans still queued at shutdown may take to go out.
const LAST_EXPORT: Duration = Duration::from_secs(2);

/// What became of the spans that ended, as the metrics show it.
#[derive(Debug, Default)]
pub struct SpanCounts {
    /// Accepted by the collector.
    pub exported: AtomicU64,
    /// Not queued: the queue was full.
    pub dropped: AtomicU64,
    /// Sent, and refused or never answered.
    pub failed: AtomicU64,
}

/// The processor the tracer provider hands every ended span to: it queues the
/// span if there is room, or counts it dropped. Never blocks.
#[derive(Debug)]
pub(super) struct Bounded {
    tx: mpsc::Sender<SpanData>,
    counts: Arc<SpanCounts>,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.tx.try_send(span).is_err() {
            self.counts.dropped.fetch_add(1, Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The queue's two ends: the processor, and the task that exports what it
/// queues until `stop` turns true, then exports what is left (within
/// [`LAST_EXPORT`]) and ends.
pub(super) fn start<E: SpanExporter + 'static>(
    exporter: E,
    counts: Arc<SpanCounts>,
    stop: watch::Receiver<bool>,
) -> (Bounded, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let task = tokio::spawn(run(exporter, rx, counts.clone(), stop));
    (Bounded { tx, counts }, task)
}

async fn run<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<SpanData>,
    counts: Arc<SpanCounts>,
    mut stop: watch::Receiver<bool>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    break;
                }
            }
            _ = stop.wait_for(|s| *s) => break,
        }
        if batch.len() < BATCH {
            let _ = tokio::time::timeout(GATHER, async {
                while batch.len() < BATCH {
                    let room = BATCH - batch.len();
                    if rx.recv_many(&mut batch, room).await == 0 {
                        break;
                    }
                }
            })
            .await;
        }
        send(&exporter, &mut batch, &counts).await;
    }
    // What is queued at shutdown goes out if the collector takes it in time.
    let _ = tokio::time::timeout(LAST_EXPORT, async {
        while let Ok(span) = rx.try_recv() {
            batch.push(span);
            if batch.len() == BATCH {
                send(&exporter, &mut batch, &counts).await;
            }
        }
        send(&exporter, &mut batch, &counts).await;
    })
    .await;
    let _ = exporter.shutdown();
}

/// One export of `batch` (emptied), counted. The exporter bounds its own
/// request (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default).
async fn send<E: SpanExporter>(exporter: &E, batch: &mut Vec<SpanData>, counts: &SpanCounts) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len() as u64;
    let spans = std::mem::replace(batch, Vec::with_capacity(BATCH));
    match exporter.export(spans).await {
        Ok(()) => counts.exported.fetch_add(n, Relaxed),
        Err(e) => {
            tracing::debug!(error = %e, spans = n, "the trace collector did not take a batch of spans");
            counts.failed.fetch_add(n, Relaxed)
        }
    };
}
