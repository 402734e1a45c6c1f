//! waitd: an HTTP service that waits for things so that its users don't have to.
//!
//! The library exposes [`serve`], which tests and the `waitd` binary both call with a
//! bound listener and a shutdown future. The parts, and which way they depend:
//! [`engine`] (pure) ← [`probe`] (one GET → one observation) ← [`worker`] (leases,
//! timers) → [`store`] ← [`api`] (HTTP). The API and the worker never import each
//! other. Every request to a host waitd does not run, a probe's or a webhook's,
//! goes through [`outbound`].

#[macro_use]
mod sentence;

pub mod api;
pub mod bus;
pub mod callbacks;
pub mod client;
pub mod config;
pub mod cpu;
pub mod engine;
pub mod events;
pub mod files;
pub mod groups;
mod linger;
pub mod metrics;
pub mod model;
pub mod notify;
pub mod outbound;
pub mod presets;
pub mod probe;
pub mod retention;
pub mod server;
pub mod signals;
pub mod sources;
pub mod store;
pub mod tokens;
pub mod traces;
pub mod worker;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{Config, SettingError};

/// Why waitd did not start: each is a sentence for the operator.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting cannot be used as given.
    #[error(transparent)]
    Setting(#[from] SettingError),
    /// No tokens on an address others can reach.
    #[error(
        "refusing to serve anonymously on {0}: configure API tokens (WAITD_TOKENS or --tokens-file), listen on a loopback address, or pass --allow-anonymous"
    )]
    Anonymous(SocketAddr),
    /// The database is not there as configured (Postgres says why).
    #[error("{0}")]
    Database(String),
    /// The store could not be opened or prepared.
    #[error("cannot prepare the database: {0}")]
    Store(#[from] store::StoreError),
    /// The listening socket.
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
}

/// Makes the stored operator's sources those of `--credentials-file`: each
/// replica does so at start-up, with the same file.
async fn declare_operator_sources(
    store: &store::Store,
    credentials: &outbound::credentials::Credentials,
) -> Result<(), StartError> {
    let declared: Vec<_> = credentials
        .sources()
        .iter()
        .map(|(name, o)| {
            (
                o.hook_id.as_str(),
                store::sources::NewSource {
                    tenant: store::sources::OPERATOR,
                    name,
                    kind: o.kind,
                    key_from: &o.key_from,
                    lookback: o.lookback,
                    secret: &o.secret,
                },
            )
        })
        .collect();
    store
        .sources()
        .declare_operator(&declared, chrono::Utc::now())
        .await?;
    Ok(())
}

/// `host=ip` pairs of `--resolve`.
fn parse_resolve(entries: &[String]) -> Result<Vec<(String, SocketAddr)>, SettingError> {
    entries
        .iter()
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (host, ip) = e
                .split_once('=')
                .ok_or_else(|| SettingError(format!("--resolve entry \"{e}\" is not host=ip")))?;
            let ip: std::net::IpAddr = ip.trim().parse().map_err(|_| {
                SettingError(format!(
                    "--resolve entry \"{e}\" has no valid IP address after ="
                ))
            })?;
            Ok((host.trim().to_ascii_lowercase(), SocketAddr::new(ip, 0)))
        })
        .collect()
}

/// A running waitd without its listener: the router, and the tasks behind it (the
/// event pipeline, the worker pool). [`serve`] puts it behind a socket; a test can
/// call the router directly (`tower::ServiceExt::oneshot`).
pub struct App {
    /// Every route, with its state.
    pub router: axum::Router,
    /// The store the app runs on.
    pub store: store::Store,
    /// What the worker pool, the deliverer, the sweep and the token watcher
    /// report as they work (only with the `test-signals`
    /// feature; else it sends nowhere).
    pub signals: signals::Signals,
    stop: watch::Sender<bool>,
    /// Every task started here but the event pipeline's, awaited on shutdown
    /// before the store closes.
    tasks: Vec<JoinHandle<()>>,
    events: events::Events,
    connections: server::Limits,
    traces: traces::Traces,
}

impl App {
    /// Checks the settings, opens and migrates the store, and starts the event
    /// pipeline and (unless `--no-worker`) the worker pool. `addr` is where it will
    /// be reached, for the anonymous-use check and the start-up line.
    pub async fn start(config: Config, addr: SocketAddr) -> Result<App, StartError> {
        if let Some(n) = config.process.cpu_threads {
            cpu::configure(n);
        }
        let token_sources = tokens::Sources::of(&config.api);
        // The file's stamp before its first read: a change from then on is
        // reloaded, however late the watcher starts.
        let token_stamp = token_sources.file_stamp().await;
        let token_set = tokens::Tokens::new(token_sources.load().await?);
        let tokens: HashMap<String, String> = token_set
            .current()
            .iter()
            .map(|(k, g)| (k.clone(), g.tenant.clone()))
            .collect();
        let cors_origins = parse_origins(&config.api.cors_origins)?;
        if tokens.is_empty() && !addr.ip().is_loopback() && !config.api.allow_anonymous {
            return Err(StartError::Anonymous(addr));
        }
        let limits = engine::Limits {
            min_poll_interval: config.api.min_poll_interval,
            max_timeout: config.api.max_timeout,
            dns_tenant_resolvers: config.outbound.dns_tenant_resolvers,
            ..Default::default()
        };
        let presets = presets::Registry::load(config.api.presets_dir.as_deref(), &limits)?;
        let guard = outbound::Guard::new(&config.outbound.allow_targets)?;
        let credentials = Arc::new(
            outbound::credentials::Credentials::load(config.outbound.credentials_file.as_deref())
                .await?,
        );
        let traces = match traces::endpoint(config.traces.otlp_endpoint.as_deref())? {
            Some(url) => traces::Traces::export_to(&url)?,
            None => traces::Traces::off(),
        };
        let bus = bus::Bus::new();
        let (store, sealed) = open_store(&config.database, bus.clone()).await?;
        declare_operator_sources(&store, &credentials).await?;
        let prober = probe::Prober::new(probe::ProbeConfig {
            timeout: config.outbound.probe_timeout,
            max_body: config.outbound.max_body,
            guard: guard.clone(),
            resolve_overrides: parse_resolve(&config.outbound.resolve)?,
            per_host_concurrency: config.outbound.per_host_concurrency.max(1),
            identity: config.outbound.probe_identity.clone(),
            share_window: config.outbound.share_window,
            max_host_pause: config.outbound.max_host_pause,
            host_rate: config.outbound.host_rate,
            credentials: credentials.clone(),
            traces: traces.clone(),
            dns: probe::dns::Resolvers {
                operator: match config.outbound.dns_resolver {
                    Some(at) => Some(at),
                    None => probe::dns::system_resolver().await,
                },
                tenants: config.outbound.dns_tenant_resolvers,
            },
        })?;

        let fd_limit = server::raise_fd_limit();
        let connections = server::Limits::new(&config.server, fd_limit);
        let max_connections = connections.max_connections;
        // The summary comes first, so the first line says what this replica runs
        // with; what deserves a second look follows it.
        log_start(&config, &store, addr, &tokens, max_connections, fd_limit);
        if tokens.is_empty() {
            tracing::warn!(%addr, "no API tokens configured: serving anonymously");
        }
        if !sealed {
            tracing::info!("no WAITD_SECRET_KEY: target header values are stored unencrypted");
        }
        let (stop, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let metrics = Arc::new(metrics::Metrics::default());
        if let Some(counts) = traces.counts() {
            let _ = metrics.spans.set(counts);
        }
        // The sequencer and the LISTEN adapter (Postgres), and the feed.
        let events = events::Events::start(&store, &bus, || stopped(stop_rx.clone()));
        let mut tasks = Vec::new();
        // Groups are decided on every replica, as their members end.
        tasks.push(tokio::spawn(groups::watch::run(
            store.groups().clone(),
            bus.clone(),
            metrics.clone(),
            stopped(stop_rx.clone()),
        )));
        // Callback waits whose heartbeat fell silent end on every replica.
        tasks.push(tokio::spawn(callbacks::run(
            store.callbacks().clone(),
            stopped(stop_rx.clone()),
        )));
        let deliveries_wake = Arc::new(tokio::sync::Notify::new());
        #[cfg(feature = "test-signals")]
        let signals = signals::Signals::channel();
        #[cfg(not(feature = "test-signals"))]
        let signals = signals::Signals::default();
        let (live, inbox) = bus::live::channel();
        if !config.worker.no_worker {
            tasks.push(share_pauses(
                &prober,
                &store,
                &bus,
                stopped(stop_rx.clone()),
            ));
            if prober.has_host_rate() {
                tasks.push(tokio::spawn(count_replicas(
                    prober.clone(),
                    store.leases().clone(),
                    (config.worker.lease_ttl / 3).clamp(
                        std::time::Duration::from_secs(1),
                        std::time::Duration::from_secs(10),
                    ),
                    stopped(stop_rx.clone()),
                )));
            }
            let client = prober.client().clone();
            let mut w = worker_for(
                &config.worker,
                config.api.min_poll_interval,
                config.database.db_connections,
                &store,
                prober,
                &bus,
                &metrics,
            );
            w.signals = signals.clone();
            w.live = Some(inbox);
            let d = notify::Deliverer {
                outbox: store.outbox().clone(),
                bus: bus.clone(),
                metrics: metrics.clone(),
                owner: w.owner,
                cfg: notify::NotifyConfig {
                    timeout: config
                        .webhooks
                        .webhook_timeout
                        .min(config.worker.lease_ttl / 2),
                    retry_base: config.webhooks.webhook_retry_base,
                    lease_ttl: config.worker.lease_ttl,
                    concurrency: config.webhooks.webhook_concurrency.max(1),
                    per_tenant: config.webhooks.webhook_concurrency_per_tenant as usize,
                    client,
                },
                wake: deliveries_wake,
                signals: signals.clone(),
            };
            tasks.push(tokio::spawn(w.run(stopped(stop_rx.clone()))));
            tasks.push(tokio::spawn(d.run(stopped(stop_rx.clone()))));
        }
        tasks.push(tokio::spawn(token_set.clone().watch(
            token_sources,
            token_stamp,
            signals.clone(),
            stopped(stop_rx.clone()),
        )));
        tasks.push(tokio::spawn(retention::expire_source_events(
            store.sources().clone(),
            stopped(stop_rx.clone()),
        )));
        let retention = Arc::new(retention::Stats::default());
        tasks.push(tokio::spawn(retention::run(
            store.retention().clone(),
            config.database.retention,
            retention.clone(),
            signals.clone(),
            stopped(stop_rx.clone()),
        )));
        let state = api::AppState {
            store: store.clone(),
            bus,
            limits: Arc::new(limits),
            presets: Arc::new(presets),
            metrics,
            guard: Arc::new(guard),
            credentials,
            tokens: token_set.clone(),
            max_active_waits: config.api.max_active_waits,
            rate: Arc::new(api::RateLimiter::new(config.api.rate_limit)),
            callback_rate: Arc::new(api::callbacks::AddressLimiter::default()),
            nudge_rate: Arc::new(api::callbacks::AddressLimiter::new(
                api::nudges::PER_SECOND,
                api::nudges::BURST,
                "nudge URLs",
            )),
            hook_rate: Arc::new(api::callbacks::AddressLimiter::new(
                api::hooks::PER_SECOND,
                api::hooks::BURST,
                "hook URLs",
            )),
            event_caps: crate::store::sources::EventCaps {
                events: config.api.source_events,
                bytes: config.api.source_event_bytes,
            },
            stopping: stop_rx,
            feed: events.feed.clone(),
            // A stream holds its connection busy, and a busy connection is never
            // given up for a new one (§6.9): streams may hold at most half the
            // connection slots, and one tenant's at most a quarter, whatever the
            // flags say, so a stream-opening tenant cannot take every slot.
            streams: api::streams::StreamLimits::new(
                config.api.max_streams.min(max_connections / 2).max(1),
                config
                    .api
                    .max_streams_per_tenant
                    .min(max_connections / 4)
                    .max(1),
            ),
            body_timeout: config.api.body_timeout,
            traces: traces.clone(),
            cors_origins: Arc::new(cors_origins),
            live,
            retention,
            active_count: Default::default(),
            signals: signals.clone(),
            replays: Arc::new(tokio::sync::Semaphore::new(
                (config.database.db_connections as usize / 4).max(1),
            )),
        };
        Ok(App {
            router: api::router(state),
            store,
            signals,
            stop,
            tasks,
            events,
            connections,
            traces,
        })
    }

    /// Stops it: blocked requests and streams end, the worker finishes in-flight
    /// probes and releases its leases, every other task it started ends, the event
    /// tasks end, and only then the store closes.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        self.events.stopped().await;
        self.store.close().await;
        self.traces.stop().await;
    }
}

/// The store `config` names (no URL: the embedded SQLite file in the working
/// directory), checked and migrated, with its cipher; and whether that cipher
/// seals header values.
async fn open_store(
    config: &config::Database,
    bus: bus::Bus,
) -> Result<(store::Store, bool), StartError> {
    let url = config
        .database_url
        .clone()
        .unwrap_or_else(|| "sqlite://waitd.db".to_string());
    let cipher = store::secrets::Cipher::new(
        config.secret_key.as_deref(),
        config.secret_key_previous.as_deref(),
    )?;
    let sealed = cipher.is_enabled();
    let store = store::Store::open(&url, config.db_connections, bus)?.with_cipher(cipher);
    if let Some(pg) = store.postgres()
        && let Some(why) = pg.diagnose().await
    {
        return Err(StartError::Database(why));
    }
    store.migrate().await?;
    // The outbox's bounds are applied by the store, in every event's transaction.
    store
        .outbox()
        .set_limits(store::DeliveryLimits {
            per_webhook: config.max_pending_deliveries_per_webhook,
            per_wait: config.max_pending_deliveries_per_wait,
            per_tenant: config.max_pending_deliveries_per_tenant,
            redelivery_interval: config.webhook_redelivery_interval,
        })
        .await?;
    Ok((store, sealed))
}

/// Keeps `--host-rate`'s share current: the replicas alive, counted in the
/// store every `every`.
async fn count_replicas(
    prober: probe::Prober,
    leases: store::Leases,
    every: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        match leases.replicas_alive().await {
            Ok(n) => prober.set_replicas(u32::try_from(n).unwrap_or(u32::MAX)),
            Err(e) => {
                tracing::warn!(error = %e, "could not count the replicas alive for --host-rate")
            }
        }
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Host pauses go both ways between the replicas: those `prober` sets are
/// announced through the store (Postgres; a SQLite store has no other replica),
/// and those the others announce, which the bus brings, pause the host here too.
fn share_pauses(
    prober: &probe::Prober,
    store: &store::Store,
    bus: &bus::Bus,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let mut set_here = prober.announce_pauses();
    let mut heard = bus.subscribe_pauses();
    let (prober, store) = (prober.clone(), store.clone());
    tokio::spawn(async move {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                Some(p) = set_here.recv() => {
                    if let Err(e) = store.announce_pause(&p).await {
                        tracing::warn!(error = %e, host = %p.host, "could not tell the other replicas of a host pause");
                    }
                }
                m = heard.recv() => match m {
                    Ok(p) => prober.heard_pause(&p),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    })
}

fn worker_for(
    config: &config::Worker,
    floor: std::time::Duration,
    db_connections: u32,
    store: &store::Store,
    prober: probe::Prober,
    bus: &bus::Bus,
    metrics: &Arc<metrics::Metrics>,
) -> worker::Worker {
    let owner = uuid::Uuid::now_v7();
    let _ = metrics.owner.set(owner);
    let _ = metrics.probe_requests.set(prober.request_counts());
    let _ = metrics.tokens.set(prober.tokens());
    worker::Worker {
        leases: store.leases().clone(),
        prober,
        bus: bus.clone(),
        cfg: worker::WorkerConfig {
            lease_ttl: config.lease_ttl,
            floor,
            capacity: config.capacity,
            concurrency: config.concurrency,
            // Leave half the pool to the API.
            max_writes: (db_connections as usize / 2).max(1),
            // A dead replica's waits are claimable once its lease expires; sweep
            // often enough that takeover follows the TTL closely.
            claim_interval: (config.lease_ttl / 10).clamp(
                std::time::Duration::from_millis(100),
                std::time::Duration::from_secs(1),
            ),
            ..Default::default()
        },
        metrics: metrics.clone(),
        owner,
        signals: signals::Signals::default(),
        live: None,
    }
}

/// The start-up line: what this replica runs on and with.
fn log_start(
    config: &Config,
    store: &store::Store,
    addr: SocketAddr,
    tokens: &HashMap<String, String>,
    max_connections: usize,
    fd_limit: Option<u64>,
) {
    tracing::info!(
        store = %store.describe(),
        %addr,
        auth = %if tokens.is_empty() {
            "anonymous".to_string()
        } else {
            let tenants: std::collections::HashSet<&String> = tokens.values().collect();
            format!("{} tokens for {} tenants", tokens.len(), tenants.len())
        },
        allow_targets = %if config.outbound.allow_targets.is_empty() {
            "none (internal addresses refused)".to_string()
        } else {
            config.outbound.allow_targets.join(",")
        },
        worker = %if config.worker.no_worker {
            "off".to_string()
        } else {
            format!(
                "capacity {}, concurrency {} ({} a host), lease TTL {}, min poll interval {}",
                config.worker.capacity,
                config.worker.concurrency,
                config.outbound.per_host_concurrency,
                engine::duration::format(config.worker.lease_ttl),
                engine::duration::format(config.api.min_poll_interval)
            )
        },
        max_connections,
        open_files = fd_limit.unwrap_or(0),
        cpu_threads = cpu::pool().threads(),
        "waitd starting"
    );
}

/// Runs waitd on `listener` until `shutdown` resolves ([`App::start`], then the
/// HTTP server). On shutdown: blocked requests and streams end, the worker
/// finishes in-flight probes and releases its leases, and this returns.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let addr = listener.local_addr()?;
    App::start(config, addr)
        .await?
        .serve(listener, shutdown)
        .await
}

impl App {
    /// Serves this app on `listener` until `shutdown` resolves, then stops it, as
    /// [`serve`] does (a test that started it holds its [`App::signals`]).
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        let app = self;
        let addr = listener.local_addr()?;
        let (down_tx, down_rx) = watch::channel(false);
        let stop = app.stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop.send(true);
            let _ = down_tx.send(true);
        });
        tracing::info!(%addr, "waitd listening");
        let down = async move {
            let mut rx = down_rx;
            let _ = rx.wait_for(|s| *s).await;
        };
        server::run(listener, app.router.clone(), app.connections, down).await;
        app.stop().await;
        Ok(())
    }
}

/// The `--cors-origins` entries: each exactly `scheme://host[:port]`, as a browser
/// sends it in `Origin` (no path, no wildcard).
fn parse_origins(entries: &[String]) -> Result<Vec<axum::http::HeaderValue>, SettingError> {
    entries
        .iter()
        .map(|e| e.trim())
        .filter(|e| !e.is_empty())
        .map(|e| {
            let url = url::Url::parse(e).map_err(|_| {
                SettingError(format!("--cors-origins entry \"{e}\" is not an origin such as https://dash.example.com"))
            })?;
            let origin = url.origin().ascii_serialization();
            if !matches!(url.scheme(), "http" | "https") || origin != e.trim_end_matches('/') {
                return Err(SettingError(format!(
                    "--cors-origins entry \"{e}\" must be exactly an origin (scheme, host and port, no path), such as {origin}"
                )));
            }
            axum::http::HeaderValue::from_str(&origin).map_err(|_| {
                SettingError(format!("--cors-origins entry \"{e}\" is not a valid header value"))
            })
        })
        .collect()
}
