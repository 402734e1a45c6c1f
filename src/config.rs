//! Operator settings: parsed once into typed structs, one a consumer (the server,
//! the store, the API, the worker, the way out, the webhooks, the traces, the
//! process), so that each part is given only its own. Each is a flag of `waitd
//! serve` and an environment variable (names fixed by the design).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::engine::duration::{self, DurationError};

sentence_error! {
    /// A setting that cannot be used as given; the sentence names it and says what
    /// to write instead.
    pub struct SettingError;
}

/// `--retention`: a duration, or `0` for keeping everything.
fn parse_retention(s: &str) -> Result<Duration, DurationError> {
    match s.trim() {
        "0" => Ok(Duration::ZERO),
        s => parse_duration(s),
    }
}

/// A setting's duration; spaces around it (from an env file, say) are forgiven.
fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    duration::parse(s.trim())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Every setting of `waitd serve`, one group a consumer: each part is given its
/// own group and nothing else. The flags and their environment variables are
/// those of docs/design.md §8, whichever group holds them; each flag's
/// `display_order` keeps `--help` listing them in the order it always has.
#[derive(Clone, Args)]
pub struct Config {
    #[command(flatten)]
    pub server: Server,
    #[command(flatten)]
    pub database: Database,
    #[command(flatten)]
    pub api: Api,
    #[command(flatten)]
    pub worker: Worker,
    #[command(flatten)]
    pub outbound: Outbound,
    #[command(flatten)]
    pub webhooks: Webhooks,
    #[command(flatten)]
    pub traces: Traces,
    #[command(flatten)]
    pub process: Process,
}

/// The HTTP server's: where it listens, and its connection caps and timeouts
/// ([`crate::server`]).
#[derive(Clone, Args)]
pub struct Server {
    /// Address to serve on.
    #[arg(
        display_order = 0,
        long,
        env = "WAITD_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,

    /// Most client connections open at once (kept below the open-file limit);
    /// beyond it, a new connection takes the place of an idle one, or waits until
    /// one closes when every one has a request in flight.
    #[arg(
        display_order = 28,
        long,
        env = "WAITD_MAX_CONNECTIONS",
        default_value_t = 4096
    )]
    pub max_connections: usize,

    /// Most client connections open at once from one address (an IPv4 address or
    /// an IPv6 /64; loopback too); beyond it, a new one takes the place of that
    /// address's own idle one, or is refused with 429. Default: half of
    /// --max-connections; 0 for no such cap (behind a reverse proxy).
    #[arg(display_order = 29, long, env = "WAITD_MAX_CONNECTIONS_PER_ADDRESS")]
    pub max_connections_per_address: Option<usize>,

    /// How long a client has to send a request's headers after the previous
    /// response; an idle keep-alive connection is closed after it too.
    #[arg(display_order = 30, long, env = "WAITD_HEADER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// How long a new connection has to send its first request's headers (at most
    /// --header-timeout).
    #[arg(display_order = 31, long, env = "WAITD_FIRST_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub first_header_timeout: Duration,
}

/// The store's: where it is, its connections, its key for values at rest, the
/// outbox's bounds and how long ended waits are kept ([`crate::store`],
/// [`crate::retention`]).
#[derive(Clone, Args)]
pub struct Database {
    /// The store: `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, `sqlite://PATH`
    /// (a file, created if missing), or `sqlite::memory:` (gone when the process
    /// stops). Unset: the SQLite file `waitd.db` in the working directory.
    #[arg(display_order = 1, long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Database connections this replica may open.
    #[arg(
        display_order = 27,
        long,
        env = "WAITD_DB_CONNECTIONS",
        default_value_t = 16
    )]
    pub db_connections: u32,

    /// Key that encrypts target header values, client keys and webhook secrets at
    /// rest.
    #[arg(
        display_order = 11,
        long,
        env = "WAITD_SECRET_KEY",
        hide_env_values = true
    )]
    pub secret_key: Option<String>,

    /// The key before the last rotation: only reads values sealed under it.
    #[arg(
        display_order = 12,
        long,
        env = "WAITD_SECRET_KEY_PREVIOUS",
        hide_env_values = true
    )]
    pub secret_key_previous: Option<String>,

    /// Most pending deliveries of one webhook of a wait; beyond it the oldest that
    /// wait behind the one first in line are dropped.
    #[arg(display_order = 40, long, env = "WAITD_MAX_PENDING_DELIVERIES_PER_WEBHOOK", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_pending_deliveries_per_webhook: u32,

    /// Most pending deliveries of one wait, over its webhooks.
    #[arg(display_order = 41, long, env = "WAITD_MAX_PENDING_DELIVERIES_PER_WAIT", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_pending_deliveries_per_wait: u32,

    /// Most pending deliveries of one tenant, over its waits.
    #[arg(display_order = 42, long, env = "WAITD_MAX_PENDING_DELIVERIES_PER_TENANT", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_pending_deliveries_per_tenant: u32,

    /// Least time between two redeliveries of one delivery
    /// (`POST /waits/{id}/deliveries/{d}/retry`; 429 sooner).
    #[arg(display_order = 43, long, env = "WAITD_WEBHOOK_REDELIVERY_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub webhook_redelivery_interval: Duration,

    /// How long ended waits are kept (with their events, deliveries, spec and
    /// idempotency key) before they are deleted; `0` keeps them all.
    #[arg(display_order = 45, long, env = "WAITD_RETENTION", default_value = "30d", value_parser = parse_retention)]
    pub retention: Duration,
}

/// The API's: who may call it, what a request may ask for, and its rates and
/// stream caps ([`crate::api`], [`crate::tokens`], [`crate::presets`]).
#[derive(Clone, Args)]
pub struct Api {
    /// API tokens as `tenant:token` pairs, comma-separated.
    #[arg(
        display_order = 5,
        long = "tokens",
        env = "WAITD_TOKENS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub tokens: Vec<String>,

    /// A file of `tenant:token` pairs, one a line.
    #[arg(display_order = 6, long, env = "WAITD_TOKENS_FILE")]
    pub tokens_file: Option<std::path::PathBuf>,

    /// Serve without tokens on a non-loopback address.
    #[arg(display_order = 9, long, env = "WAITD_ALLOW_ANONYMOUS")]
    pub allow_anonymous: bool,

    /// Floor under every poll and retry delay.
    #[arg(display_order = 2, long, env = "WAITD_MIN_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub min_poll_interval: Duration,

    /// Largest `timeout` a request may ask for.
    #[arg(display_order = 3, long, env = "WAITD_MAX_TIMEOUT", default_value = "24h", value_parser = parse_duration)]
    pub max_timeout: Duration,

    /// Most running waits one tenant may have at once (429 beyond).
    #[arg(
        display_order = 13,
        long,
        env = "WAITD_MAX_ACTIVE_WAITS",
        default_value_t = 10_000
    )]
    pub max_active_waits: i64,

    /// API requests per second one token may make, on average (429 beyond); 0 for no limit.
    #[arg(
        display_order = 14,
        long,
        env = "WAITD_RATE_LIMIT",
        default_value_t = 50.0
    )]
    pub rate_limit: f64,

    /// How long a client has to send a whole request body.
    #[arg(display_order = 32, long, env = "WAITD_BODY_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub body_timeout: Duration,

    /// The most events one tenant's event sources keep at once (within their
    /// lookback windows); an event past it is refused with a 429.
    #[arg(
        display_order = 47,
        long,
        env = "WAITD_SOURCE_EVENTS",
        default_value_t = 10_000
    )]
    pub source_events: i64,

    /// The most bytes of events (bodies and kept headers) one tenant's event
    /// sources keep at once; an event past it is refused with a 429.
    #[arg(display_order = 48, long, env = "WAITD_SOURCE_EVENT_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub source_event_bytes: i64,

    /// Most event streams and blocked requests this replica holds open at once
    /// (429 beyond).
    #[arg(
        display_order = 33,
        long,
        env = "WAITD_MAX_STREAMS",
        default_value_t = 4096
    )]
    pub max_streams: usize,

    /// Most event streams and blocked requests one tenant holds open on this
    /// replica at once (429 beyond).
    #[arg(
        display_order = 34,
        long,
        env = "WAITD_MAX_STREAMS_PER_TENANT",
        default_value_t = 1024
    )]
    pub max_streams_per_tenant: usize,

    /// Origins whose pages may call the API from a browser (CORS), exact
    /// (`https://dash.example.com`), comma-separated; none by default.
    #[arg(
        display_order = 35,
        long,
        env = "WAITD_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,

    /// A directory of extra presets (`<name>.json` files), added to the built-in ones;
    /// a file named like a built-in preset replaces it.
    #[arg(display_order = 46, long, env = "WAITD_PRESETS_DIR")]
    pub presets_dir: Option<std::path::PathBuf>,
}

/// The worker pool's ([`crate::worker`]).
#[derive(Clone, Args)]
pub struct Worker {
    /// Do not run the worker pool or deliver webhooks (serve the API only).
    #[arg(display_order = 44, long, env = "WAITD_NO_WORKER")]
    pub no_worker: bool,

    /// How long a replica's lease on the waits it holds lasts without renewal.
    #[arg(display_order = 10, long, env = "WAITD_LEASE_TTL", default_value = "30s", value_parser = parse_duration)]
    pub lease_ttl: Duration,

    /// Most waits one replica holds at once.
    #[arg(
        display_order = 19,
        long,
        env = "WAITD_CAPACITY",
        default_value_t = 100_000
    )]
    pub capacity: usize,

    /// Most probes in flight at once.
    #[arg(
        display_order = 20,
        long,
        env = "WAITD_CONCURRENCY",
        default_value_t = 512
    )]
    pub concurrency: usize,
}

/// The way out's: which hosts the guard lets through, how they resolve, the
/// operator's credentials, and how probes go ([`crate::outbound`],
/// [`crate::probe`]).
#[derive(Clone, Args)]
pub struct Outbound {
    /// Hosts, `*.suffix`es, IPs or CIDRs let past the SSRF guard (comma-separated).
    #[arg(
        display_order = 4,
        long,
        env = "WAITD_ALLOW_TARGETS",
        value_delimiter = ','
    )]
    pub allow_targets: Vec<String>,

    /// Fixed DNS answers, `host=ip` (comma-separated), still judged by the SSRF guard:
    /// like curl's --resolve, for split-horizon names and for tests.
    #[arg(display_order = 15, long, env = "WAITD_RESOLVE", value_delimiter = ',')]
    pub resolve: Vec<String>,

    /// A JSON file of credentials waits may name by `target.auth.credential`,
    /// each for the tenants it lists (docs/engine.md §3.2).
    #[arg(display_order = 7, long, env = "WAITD_CREDENTIALS_FILE")]
    pub credentials_file: Option<std::path::PathBuf>,

    /// Per-request timeout of a probe.
    #[arg(display_order = 17, long, env = "WAITD_PROBE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub probe_timeout: Duration,

    /// Largest response body a probe reads, in bytes.
    #[arg(display_order = 18, long, env = "WAITD_MAX_BODY", default_value_t = 1024 * 1024)]
    pub max_body: usize,

    /// Most probes in flight to one target host.
    #[arg(
        display_order = 22,
        long,
        env = "WAITD_PER_HOST_CONCURRENCY",
        default_value_t = 16
    )]
    pub per_host_concurrency: usize,

    /// Sent as the `Waitd-Replica` header with every probe, so a target's logs tell
    /// which replica polled (and tests can, too); no such header when unset.
    #[arg(display_order = 23, long, env = "WAITD_PROBE_IDENTITY")]
    pub probe_identity: Option<String>,

    /// A wait that falls due reads the response of the identical request (same
    /// tenant, URL and headers), or the probe of the same tcp://, tls://, grpc://
    /// or dns:// target, another wait began at most this long ago, or that is
    /// still in flight; `0s` turns sharing off.
    #[arg(display_order = 24, long, env = "WAITD_SHARE_WINDOW", default_value = "1s", value_parser = parse_duration)]
    pub share_window: Duration,

    /// The longest a target host that asks for quiet (429/503 `Retry-After`, a
    /// rate limit with none remaining) is left unpolled by every wait on this
    /// replica; at most 1h.
    #[arg(display_order = 25, long, env = "WAITD_MAX_HOST_PAUSE", default_value = "1h", value_parser = parse_duration)]
    pub max_host_pause: Duration,

    /// Requests a second to one target host across the replicas (each takes its
    /// share of the replicas alive); 0: no limit beyond --per-host-concurrency.
    #[arg(
        display_order = 26,
        long,
        env = "WAITD_HOST_RATE",
        default_value_t = 0.0
    )]
    pub host_rate: f64,

    /// The resolver `dns://` targets are asked through, IP or IP:PORT (port 53
    /// when left out); the first nameserver of /etc/resolv.conf when unset.
    #[arg(display_order = 47, long, env = "WAITD_DNS_RESOLVER", value_parser = parse_dns_resolver)]
    pub dns_resolver: Option<std::net::SocketAddr>,

    /// Let a `dns://` target name its own resolver (`resolver=HOST:PORT`), judged
    /// by the SSRF guard as any target; off: only --dns-resolver is asked.
    #[arg(display_order = 48, long, env = "WAITD_DNS_TENANT_RESOLVERS")]
    pub dns_tenant_resolvers: bool,
}

/// The webhook deliverer's ([`crate::notify`]).
#[derive(Clone, Args)]
pub struct Webhooks {
    /// The bound on one webhook delivery attempt (at most half the lease TTL).
    #[arg(display_order = 36, long, env = "WAITD_WEBHOOK_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub webhook_timeout: Duration,

    /// The unit of the webhook retry schedule: retries come 1, 6, 24, 120, 360, 720,
    /// 1440, 2880, 4320 and 5760 times this after the attempt before (±10%).
    #[arg(display_order = 37, long, env = "WAITD_WEBHOOK_RETRY_BASE", default_value = "5s", value_parser = parse_duration)]
    pub webhook_retry_base: Duration,

    /// Most webhook delivery attempts in flight at once on this replica.
    #[arg(
        display_order = 38,
        long,
        env = "WAITD_WEBHOOK_CONCURRENCY",
        default_value_t = 64
    )]
    pub webhook_concurrency: usize,

    /// Most webhook deliveries one tenant holds on this replica, in flight or waiting
    /// for a slot (at most --webhook-concurrency); each of its receivers (host and
    /// port) has at most half of it in flight.
    #[arg(display_order = 39, long, env = "WAITD_WEBHOOK_CONCURRENCY_PER_TENANT", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub webhook_concurrency_per_tenant: u32,
}

/// Where spans go ([`crate::traces`]).
#[derive(Clone, Args)]
pub struct Traces {
    /// The OpenTelemetry collector's OTLP/HTTP address (`http://HOST:4318`):
    /// spans of API requests, polls, webhook attempts and token mints go to its
    /// `/v1/traces` (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` names that URL itself).
    /// Unset: no spans are made.
    #[arg(display_order = 8, long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// The process's own: its log lines and its CPU pool ([`crate::cpu`]).
#[derive(Clone, Args)]
pub struct Process {
    /// `text` or `json`.
    #[arg(
        display_order = 16,
        long,
        env = "WAITD_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Threads that parse requests' expressions, apart from the threads that serve
    /// requests; those that read targets' answers (JSON, paths, conditions) are one
    /// fewer (at least one), at the lowest CPU priority. Tenants take turns on both.
    /// Default: the number of cores.
    #[arg(display_order = 21, long, env = "WAITD_CPU_THREADS")]
    pub cpu_threads: Option<usize>,
}

impl std::fmt::Debug for Config {
    // Secrets never print: the database URL may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.server.listen)
            .field(
                "database_url",
                &self.database.database_url.as_ref().map(|_| "<redacted>"),
            )
            .field("min_poll_interval", &self.api.min_poll_interval)
            .field("max_timeout", &self.api.max_timeout)
            .field("allow_targets", &self.outbound.allow_targets)
            .field("tokens", &format!("{} configured", self.api.tokens.len()))
            .field("lease_ttl", &self.worker.lease_ttl)
            .field(
                "secret_key",
                &self.database.secret_key.as_ref().map(|_| "<redacted>"),
            )
            .field("log_format", &self.process.log_format)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// The settings with every default, for tests and embedding: parse `args` as
    /// `waitd serve` flags would be (environment variables are read too).
    pub fn from_args<I, T>(args: I) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: Config,
        }
        use clap::Parser;
        let args = std::iter::once(std::ffi::OsString::from("waitd"))
            .chain(args.into_iter().map(Into::into));
        Wrapper::try_parse_from(args).map(|w| w.config)
    }
}

/// `--dns-resolver`: `IP`, `IP:PORT` or `[IPv6]:PORT`; port 53 when left out.
pub fn parse_dns_resolver(s: &str) -> Result<std::net::SocketAddr, String> {
    let s = s.trim();
    s.parse::<std::net::SocketAddr>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(|ip| std::net::SocketAddr::new(ip, 53)))
        .map_err(|_| {
            let shown: String = s.chars().take(100).collect();
            format!(
                "takes IP or IP:PORT, e.g. 10.0.0.2:53 or [fd00::53]:53, not \"{shown}\" (a resolver is named by its address, not a name)"
            )
        })
}
