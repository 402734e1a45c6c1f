//! Process metrics in Prometheus text format. A handful of atomics: cheap enough to
//! touch on every poll, and no registry to configure.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Bucket upper bounds in seconds, shared by the latency histograms.
const BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Each observation adds to the one bucket it falls in (three atomic adds in all,
/// whatever the value); the cumulative counts Prometheus expects are summed when
/// rendered.
#[derive(Default, Debug)]
pub struct Histogram {
    /// Observations in (previous bound, this bound]; over the last bound, none.
    counts: [AtomicU64; 12],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        // The total is read first: a bucket counted after it could otherwise make a
        // bucket's cumulative count exceed `+Inf`.
        let n = self.count.load(Relaxed);
        let mut below = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            below += self.counts[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", below.min(n));
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_micros.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {n}");
    }
}

use crate::engine::Observation;
use crate::model::{DropReason, Status};

#[derive(Default, Debug)]
pub struct Metrics {
    pub polls: [AtomicU64; Observation::KINDS.len()],
    /// Ends by status, of every wait this replica ended: groups and the members
    /// a group ended included.
    pub ended: [AtomicU64; 5],
    /// Of those, the ends of groups.
    pub groups_ended: [AtomicU64; 5],
    pub probe_latency: Histogram,
    pub schedule_lag: Histogram,
    pub db_writes: AtomicU64,
    pub held: AtomicI64,
    pub sse_subscribers: AtomicI64,
    pub created: AtomicU64,
    /// Nudges this replica's API accepted, and polls its worker pool brought
    /// forward for a nudge (many nudges at once are one).
    pub nudges: AtomicU64,
    pub nudged_polls: AtomicU64,
    /// Events event sources accepted, and refused for their signature; listening
    /// waits events matched; `match` expressions that failed on an event.
    pub source_events: AtomicU64,
    pub source_events_refused: AtomicU64,
    pub source_matches: AtomicU64,
    pub source_match_errors: AtomicU64,
    /// Responses a wait's conditions decided by evaluating them, and those decided
    /// as the identical response before them was.
    pub conditions_evaluated: AtomicU64,
    pub conditions_reused: AtomicU64,
    /// Webhook attempts by outcome ([`WEBHOOK_OUTCOMES`]).
    pub webhooks: [AtomicU64; 4],
    /// Age of the oldest pending webhook delivery in the store, in milliseconds
    /// (read about once a second by the deliverer).
    pub webhook_oldest_pending_ms: AtomicI64,
    /// From an event to its webhook's 2xx.
    pub webhook_latency: Histogram,
    /// Deliveries the store's bounds dropped, by bound ([`DropReason::ALL`]), over
    /// every replica (read about once a second by the deliverer).
    pub webhook_dropped: [AtomicI64; 3],
    /// This replica's id in the store (owner of the waits it holds), once its
    /// worker pool runs.
    pub owner: std::sync::OnceLock<uuid::Uuid>,
    /// The prober's counts of requests, once the worker pool runs.
    pub probe_requests: std::sync::OnceLock<std::sync::Arc<ProbeRequests>>,
    /// The prober's OAuth 2.0 tokens, once the worker pool runs.
    pub tokens: std::sync::OnceLock<std::sync::Arc<crate::outbound::token::Tokens>>,
    /// What became of the spans, when traces are exported.
    pub spans: std::sync::OnceLock<std::sync::Arc<crate::traces::SpanCounts>>,
}

/// What the prober counts of the requests it sends: cheap atomics it touches at
/// each request, read when the metrics are rendered.
#[derive(Default, Debug)]
pub struct ProbeRequests {
    /// Requests sent to targets.
    pub sent: AtomicU64,
    /// Polls served by a request another wait of the same request sent.
    pub shared: AtomicU64,
    /// Polls answered `304 Not Modified`, read as the response before.
    pub not_modified: AtomicU64,
    /// Distinct requests the held waits send.
    pub held: AtomicI64,
    /// Milliseconds of host pauses set (a pause that lengthens another counts
    /// what it adds).
    pub paused_ms: AtomicU64,
    /// Milliseconds requests waited for their host's turn under `--host-rate`.
    pub rate_waited_ms: AtomicU64,
    /// The replicas `--host-rate` is shared by, as last counted (0: no rate).
    pub rate_replicas: AtomicI64,
}

/// What a webhook attempt came to: delivered (2xx), retry (to be tried again),
/// failed (the schedule is spent, or the SSRF guard refused), stopped (410 Gone).
pub const WEBHOOK_OUTCOMES: [&str; 4] = ["delivered", "retry", "failed", "stopped"];

impl Metrics {
    pub fn webhook(&self, outcome: &str) {
        if let Some(i) = WEBHOOK_OUTCOMES.iter().position(|o| *o == outcome) {
            self.webhooks[i].fetch_add(1, Relaxed);
        }
    }

    pub fn poll(&self, obs: &Observation) {
        if let Some(i) = Observation::KINDS.iter().position(|o| *o == obs.kind()) {
            self.polls[i].fetch_add(1, Relaxed);
        }
    }

    pub fn ended(&self, status: Status) {
        if let Some(i) = Status::ENDS.iter().position(|s| *s == status) {
            self.ended[i].fetch_add(1, Relaxed);
        }
    }

    /// A group's end, counted besides [`Metrics::ended`].
    pub fn group_ended(&self, status: Status) {
        if let Some(i) = Status::ENDS.iter().position(|s| *s == status) {
            self.groups_ended[i].fetch_add(1, Relaxed);
        }
    }

    pub fn write(&self) {
        self.db_writes.fetch_add(1, Relaxed);
    }

    pub fn total_polls(&self) -> u64 {
        self.polls.iter().map(|p| p.load(Relaxed)).sum()
    }

    /// The Prometheus exposition; `active` is the count of running waits in the store.
    pub fn render(&self, active: Option<i64>, db_in_use: u32) -> String {
        let mut out = String::new();
        if let Some(n) = active {
            let _ = writeln!(
                out,
                "# HELP waitd_active_waits Running waits in the store (counted at most every 5 s).\n# TYPE waitd_active_waits gauge\nwaitd_active_waits {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP waitd_held_waits Running waits this replica holds a lease on.\n# TYPE waitd_held_waits gauge\nwaitd_held_waits {}",
            self.held.load(Relaxed)
        );
        if let Some(owner) = self.owner.get() {
            let _ = writeln!(
                out,
                "# HELP waitd_replica_info This replica's id in the store: the owner of the waits it holds.\n# TYPE waitd_replica_info gauge\nwaitd_replica_info{{owner=\"{owner}\"}} 1"
            );
        }
        let _ = writeln!(
            out,
            "# HELP waitd_polls_total Polls made, by what they observed.\n# TYPE waitd_polls_total counter"
        );
        for (i, o) in Observation::KINDS.iter().enumerate() {
            let _ = writeln!(
                out,
                "waitd_polls_total{{outcome=\"{o}\"}} {}",
                self.polls[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP waitd_waits_ended_total Waits ended by this replica, by status: groups, and the members a group ended, included.\n# TYPE waitd_waits_ended_total counter"
        );
        for (i, s) in Status::ENDS.iter().enumerate() {
            let _ = writeln!(
                out,
                "waitd_waits_ended_total{{status=\"{s}\"}} {}",
                self.ended[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP waitd_groups_ended_total Groups this replica decided, by status (counted in waitd_waits_ended_total too).\n# TYPE waitd_groups_ended_total counter"
        );
        for (i, s) in Status::ENDS.iter().enumerate() {
            let _ = writeln!(
                out,
                "waitd_groups_ended_total{{status=\"{s}\"}} {}",
                self.groups_ended[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP waitd_waits_created_total Waits created through this replica: a group and each member it made count.\n# TYPE waitd_waits_created_total counter\nwaitd_waits_created_total {}",
            self.created.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP waitd_nudges_total Nudges this replica accepted at nudge URLs.\n# TYPE waitd_nudges_total counter\nwaitd_nudges_total {}\n# HELP waitd_nudged_polls_total Polls this replica brought forward for a nudge (nudges that came together are one).\n# TYPE waitd_nudged_polls_total counter\nwaitd_nudged_polls_total {}",
            self.nudges.load(Relaxed),
            self.nudged_polls.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP waitd_source_events_total Events this replica's event sources accepted.\n# TYPE waitd_source_events_total counter\nwaitd_source_events_total {}\n# HELP waitd_source_events_refused_total Events refused for a missing or wrong signature.\n# TYPE waitd_source_events_refused_total counter\nwaitd_source_events_refused_total {}\n# HELP waitd_source_matches_total Listening waits an event matched.\n# TYPE waitd_source_matches_total counter\nwaitd_source_matches_total {}\n# HELP waitd_source_match_errors_total Listening waits whose match failed or ran past its budget on an event.\n# TYPE waitd_source_match_errors_total counter\nwaitd_source_match_errors_total {}",
            self.source_events.load(Relaxed),
            self.source_events_refused.load(Relaxed),
            self.source_matches.load(Relaxed),
            self.source_match_errors.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP waitd_condition_responses_total Responses that waits' conditions decided: by evaluating them, or as the identical response before (a response that never reached them, or on which they failed, is not counted).\n# TYPE waitd_condition_responses_total counter\nwaitd_condition_responses_total{{decided=\"evaluated\"}} {}\nwaitd_condition_responses_total{{decided=\"as_before\"}} {}",
            self.conditions_evaluated.load(Relaxed),
            self.conditions_reused.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP waitd_db_writes_total Write transactions the worker pool sent to the store (claims, lease renewals, releases, progress batches).\n# TYPE waitd_db_writes_total counter\nwaitd_db_writes_total {}",
            self.db_writes.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP waitd_db_connections_in_use Database connections this replica has checked out right now.\n# TYPE waitd_db_connections_in_use gauge\nwaitd_db_connections_in_use {db_in_use}"
        );
        let _ = writeln!(
            out,
            "# HELP waitd_sse_subscribers Open event streams.\n# TYPE waitd_sse_subscribers gauge\nwaitd_sse_subscribers {}",
            self.sse_subscribers.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP waitd_webhook_attempts_total Webhook delivery attempts this replica made, by outcome.\n# TYPE waitd_webhook_attempts_total counter"
        );
        for (i, o) in WEBHOOK_OUTCOMES.iter().enumerate() {
            let _ = writeln!(
                out,
                "waitd_webhook_attempts_total{{outcome=\"{o}\"}} {}",
                self.webhooks[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP waitd_webhook_oldest_pending_seconds Age of the oldest webhook delivery still pending in the store (0 when none is).\n# TYPE waitd_webhook_oldest_pending_seconds gauge\nwaitd_webhook_oldest_pending_seconds {}",
            self.webhook_oldest_pending_ms.load(Relaxed) as f64 / 1e3
        );
        let _ = writeln!(
            out,
            "# HELP waitd_webhook_deliveries_dropped_total Webhook deliveries dropped unsent by a bound on pending deliveries, by bound, in the store (every replica reports the same count).\n# TYPE waitd_webhook_deliveries_dropped_total counter"
        );
        for (i, r) in DropReason::ALL.iter().enumerate() {
            let _ = writeln!(
                out,
                "waitd_webhook_deliveries_dropped_total{{reason=\"{}\"}} {}",
                r.as_str(),
                self.webhook_dropped[i].load(Relaxed)
            );
        }
        if let Some(p) = self.probe_requests.get() {
            let _ = writeln!(
                out,
                "# HELP waitd_probe_requests_total Polls by how their response came: a request (or a probe of a tcp, tls, grpc or dns target) sent, a response shared with another wait of the same request or probe, or a 304 read as the response before.\n# TYPE waitd_probe_requests_total counter\nwaitd_probe_requests_total{{outcome=\"sent\"}} {}\nwaitd_probe_requests_total{{outcome=\"shared\"}} {}\nwaitd_probe_requests_total{{outcome=\"not_modified\"}} {}",
                p.sent.load(Relaxed),
                p.shared.load(Relaxed),
                p.not_modified.load(Relaxed)
            );
            let _ = writeln!(
                out,
                "# HELP waitd_probe_distinct_requests Distinct requests (tenant, URL, headers), and distinct probes of tcp, tls, grpc and dns targets, the waits this replica holds send.\n# TYPE waitd_probe_distinct_requests gauge\nwaitd_probe_distinct_requests {}",
                p.held.load(Relaxed)
            );
            let _ = writeln!(
                out,
                "# HELP waitd_host_paused_seconds_total Seconds of pause target hosts asked for (429/503 Retry-After, a rate limit with none remaining), during which this replica sends them nothing.\n# TYPE waitd_host_paused_seconds_total counter\nwaitd_host_paused_seconds_total {}",
                p.paused_ms.load(Relaxed) as f64 / 1000.0
            );
            let _ = writeln!(
                out,
                "# HELP waitd_host_rate_waited_seconds_total Seconds requests waited for their host's turn under --host-rate.\n# TYPE waitd_host_rate_waited_seconds_total counter\nwaitd_host_rate_waited_seconds_total {}\n# HELP waitd_host_rate_replicas The replicas alive that share --host-rate, as last counted (0: no --host-rate).\n# TYPE waitd_host_rate_replicas gauge\nwaitd_host_rate_replicas {}",
                p.rate_waited_ms.load(Relaxed) as f64 / 1000.0,
                p.rate_replicas.load(Relaxed)
            );
        }
        if let Some(t) = self.tokens.get() {
            let (sent, minted) = (t.counts.sent.load(Relaxed), t.counts.minted.load(Relaxed));
            let _ = writeln!(
                out,
                "# HELP waitd_oauth_token_requests_total Token requests to OAuth 2.0 token endpoints, by whether a token came back.\n# TYPE waitd_oauth_token_requests_total counter\nwaitd_oauth_token_requests_total{{outcome=\"minted\"}} {minted}\nwaitd_oauth_token_requests_total{{outcome=\"failed\"}} {}",
                sent.saturating_sub(minted)
            );
            let _ = writeln!(
                out,
                "# HELP waitd_oauth_tokens_refused_total Tokens a target answered 401 to, each minted again and the poll asked again.\n# TYPE waitd_oauth_tokens_refused_total counter\nwaitd_oauth_tokens_refused_total {}\n# HELP waitd_oauth_credentials Credentials (tenant, token endpoint, client) the waits this replica holds use.\n# TYPE waitd_oauth_credentials gauge\nwaitd_oauth_credentials {}",
                t.counts.rejected.load(Relaxed),
                t.held()
            );
        }
        if let Some(s) = self.spans.get() {
            let _ = writeln!(
                out,
                "# HELP waitd_trace_spans_total Spans that ended, by what became of them: taken by the collector, dropped because {} were already queued, or sent and not taken.\n# TYPE waitd_trace_spans_total counter\nwaitd_trace_spans_total{{outcome=\"exported\"}} {}\nwaitd_trace_spans_total{{outcome=\"dropped\"}} {}\nwaitd_trace_spans_total{{outcome=\"failed\"}} {}",
                crate::traces::QUEUE,
                s.exported.load(Relaxed),
                s.dropped.load(Relaxed),
                s.failed.load(Relaxed)
            );
        }
        self.webhook_latency.render(
            &mut out,
            "waitd_webhook_delivery_seconds",
            "From an event to its webhook's 2xx.",
        );
        self.probe_latency.render(
            &mut out,
            "waitd_probe_duration_seconds",
            "Time one GET of a target took.",
        );
        self.schedule_lag.render(
            &mut out,
            "waitd_schedule_lag_seconds",
            "Actual minus scheduled poll time.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_renders_cumulative_buckets_from_one_add_per_observation() {
        let h = Histogram::default();
        for ms in [0.5, 1.0, 3.0, 30.0, 30.0, 20_000.0] {
            h.observe(Duration::from_secs_f64(ms / 1e3));
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        let bucket = |le: &str| -> u64 {
            let key = format!("x_bucket{{le=\"{le}\"}} ");
            out.lines()
                .find_map(|l| l.strip_prefix(&key))
                .unwrap_or_else(|| panic!("no bucket {le} in:\n{out}"))
                .parse()
                .unwrap()
        };
        assert_eq!(bucket("0.001"), 2, "{out}");
        assert_eq!(bucket("0.002"), 2);
        assert_eq!(bucket("0.005"), 3);
        assert_eq!(bucket("0.02"), 3);
        assert_eq!(bucket("0.05"), 5);
        assert_eq!(bucket("10"), 5);
        assert_eq!(bucket("+Inf"), 6);
        assert!(out.contains("x_count 6\n"), "{out}");
    }
}
