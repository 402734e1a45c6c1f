//! The API tokens in force: which tenant each names and what it may do, and their
//! reloading without a restart (on `SIGHUP`, and when `--tokens-file` changes).
//!
//! An entry is `tenant:token` (full access) or `tenant:token:read` (read-only:
//! reads, lists and streams; no create, cancel or redelivery). A reload that fails
//! (a file that cannot be read, an entry that is malformed, or no tokens left
//! where there were some, which would open the API to anyone) keeps the tokens in
//! force and logs why. It never reads the file more than once a second.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::config::{Config, SettingError};
use crate::worker::{Signal, Signals};

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Everything its tenant may.
    Full,
    /// Reads, lists and streams only.
    Read,
}

/// What one token is: its tenant and its access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub tenant: String,
    pub access: Access,
}

/// token → grant. Empty means anonymous use.
pub type TokenSet = HashMap<String, Grant>;

/// The suffix of a read-only entry.
const READ_SUFFIX: &str = ":read";

/// Shortest token accepted.
pub const MIN_TOKEN: usize = 16;

/// How often `--tokens-file` is looked at for a change (its modification time and
/// length).
pub const FILE_CHECK: Duration = Duration::from_secs(1);

/// Reads entries (`tenant:token` or `tenant:token:read`, blank lines and `#`
/// comments skipped).
pub fn parse<S: AsRef<str>>(lines: &[S]) -> Result<TokenSet, SettingError> {
    let mut tokens = TokenSet::new();
    for (i, line) in lines.iter().enumerate() {
        let line = line.as_ref().trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (entry, access) = match line.strip_suffix(READ_SUFFIX) {
            Some(e) => (e, Access::Read),
            None => (line, Access::Full),
        };
        let (tenant, token) = entry
            .split_once(':')
            .filter(|(t, k)| !t.is_empty() && k.len() >= MIN_TOKEN)
            .ok_or_else(|| {
                SettingError(format!(
                    "API token entry {} is not tenant:token (or tenant:token:read) with a token of at least {MIN_TOKEN} characters",
                    i + 1
                ))
            })?;
        let grant = Grant {
            tenant: tenant.to_string(),
            access,
        };
        if tokens.insert(token.to_string(), grant).is_some() {
            return Err(SettingError(format!(
                "API token entry {} repeats a token",
                i + 1
            )));
        }
    }
    Ok(tokens)
}

/// Where the tokens come from: the entries of `--tokens` (fixed for the process's
/// life) and the file of `--tokens-file` (read again on each reload).
#[derive(Clone, Debug, Default)]
pub struct Sources {
    fixed: Vec<String>,
    file: Option<PathBuf>,
}

impl Sources {
    pub fn of(config: &Config) -> Sources {
        Sources {
            fixed: config.tokens.clone(),
            file: config.tokens_file.clone(),
        }
    }

    /// The tokens as the sources say now.
    pub fn load(&self) -> Result<TokenSet, SettingError> {
        let mut lines = self.fixed.clone();
        if let Some(path) = &self.file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                SettingError(format!(
                    "cannot read the tokens file {}: {e}",
                    path.display()
                ))
            })?;
            lines.extend(text.lines().map(str::to_string));
        }
        parse(&lines)
    }

    /// The file's modification time and length, to notice a change.
    fn file_stamp(&self) -> Option<(SystemTime, u64)> {
        let meta = std::fs::metadata(self.file.as_ref()?).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    }
}

/// The tokens in force, shared by every request; a reload replaces them at once.
/// Cloning is shallow.
#[derive(Clone)]
pub struct Tokens {
    tx: Arc<watch::Sender<Arc<TokenSet>>>,
    reloads: Arc<Reloads>,
}

/// Reloads so far, by outcome (for `/metrics`).
#[derive(Default)]
struct Reloads {
    done: AtomicU64,
    failed: AtomicU64,
}

impl Tokens {
    pub fn new(set: TokenSet) -> Tokens {
        Tokens {
            tx: Arc::new(watch::Sender::new(Arc::new(set))),
            reloads: Arc::default(),
        }
    }

    /// The tokens' lines of `/metrics`: how many are in force by access, and the
    /// reloads so far by outcome.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let set = self.current();
        let read = set.values().filter(|g| g.access == Access::Read).count();
        let _ = write!(
            out,
            "# HELP waitd_api_tokens API tokens in force, by access.\n\
             # TYPE waitd_api_tokens gauge\n\
             waitd_api_tokens{{access=\"full\"}} {}\n\
             waitd_api_tokens{{access=\"read\"}} {read}\n\
             # HELP waitd_token_reloads_total Reloads of the API tokens (SIGHUP, a changed tokens file), by outcome.\n\
             # TYPE waitd_token_reloads_total counter\n\
             waitd_token_reloads_total{{outcome=\"done\"}} {}\n\
             waitd_token_reloads_total{{outcome=\"failed\"}} {}\n",
            set.len() - read,
            self.reloads.done.load(Relaxed),
            self.reloads.failed.load(Relaxed),
        );
    }

    /// The set in force (an atomic count increment).
    pub fn current(&self) -> Arc<TokenSet> {
        self.tx.borrow().clone()
    }

    /// Resolves once `token` no longer has `grant`: removed, or given another
    /// tenant or access. Never, if the tokens can no longer change.
    pub fn revoked(
        &self,
        token: String,
        grant: Grant,
    ) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        async move {
            if rx
                .wait_for(|set| set.get(&token) != Some(&grant))
                .await
                .is_err()
            {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Reads the sources again and puts what they say in force, or keeps the
    /// tokens in force and says why not.
    pub fn reload(&self, sources: &Sources) -> Result<usize, SettingError> {
        let set = sources.load()?;
        if set.is_empty() && !self.current().is_empty() {
            return Err(SettingError(
                "the new tokens are none at all, which would let anyone use the API; \
                 to serve anonymously, restart with no tokens"
                    .into(),
            ));
        }
        let n = set.len();
        self.tx.send_replace(Arc::new(set));
        Ok(n)
    }

    fn reload_and_log(&self, sources: &Sources, why: &str, signals: &Signals) {
        let outcome = self.reload(sources);
        let counter = match outcome {
            Ok(_) => &self.reloads.done,
            Err(_) => &self.reloads.failed,
        };
        counter.fetch_add(1, Relaxed);
        signals.send(|| Signal::TokensReloaded {
            ok: outcome.is_ok(),
        });
        match outcome {
            Ok(n) => tracing::info!(tokens = n, cause = why, "API tokens reloaded"),
            Err(e) => tracing::warn!(
                cause = why,
                error = %e,
                "the API tokens were not reloaded; the ones in force stay"
            ),
        }
    }

    /// Reloads on `SIGHUP` and when the tokens file changes, until `stopped`.
    pub async fn watch(
        self,
        sources: Sources,
        signals: Signals,
        stopped: impl Future<Output = ()>,
    ) {
        let mut stamp = sources.file_stamp();
        #[cfg(unix)]
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(FILE_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopped = std::pin::pin!(stopped);
        loop {
            #[cfg(unix)]
            let hup = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hup = std::future::pending::<Option<()>>();
            tokio::select! {
                _ = &mut stopped => return,
                _ = hup => {
                    stamp = sources.file_stamp();
                    self.reload_and_log(&sources, "SIGHUP", &signals);
                }
                _ = tick.tick(), if sources.file.is_some() => {
                    let now = sources.file_stamp();
                    if now != stamp {
                        stamp = now;
                        self.reload_and_log(&sources, "the tokens file changed", &signals);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_ending_in_read_is_a_read_only_token() {
        let set = parse(&[
            "a:token-of-tenant-a-0001",
            "# a comment",
            "",
            "dash:token-of-the-dashboard:read",
        ])
        .unwrap();
        assert_eq!(set["token-of-tenant-a-0001"].access, Access::Full);
        let dash = &set["token-of-the-dashboard"];
        assert_eq!((dash.tenant.as_str(), dash.access), ("dash", Access::Read));
        let short = parse(&["a:short:read"]).unwrap_err();
        assert!(short.0.contains("tenant:token:read"), "{short}");
        let twice = parse(&["a:token-of-tenant-a-0001", "b:token-of-tenant-a-0001:read"]);
        assert!(twice.unwrap_err().0.contains("repeats"));
    }

    #[tokio::test]
    async fn a_reload_to_no_tokens_is_refused_and_the_old_set_stays() {
        let tokens = Tokens::new(parse(&["a:token-of-tenant-a-0001"]).unwrap());
        let err = tokens.reload(&Sources::default()).unwrap_err();
        assert!(err.0.contains("anyone"), "{err}");
        assert_eq!(tokens.current().len(), 1);
    }

    #[tokio::test]
    async fn revoked_resolves_when_the_token_goes_and_not_before() {
        let tokens =
            Tokens::new(parse(&["a:token-of-tenant-a-0001", "b:token-of-tenant-b-0001"]).unwrap());
        let grant = tokens.current()["token-of-tenant-b-0001"].clone();
        let mut gone = std::pin::pin!(tokens.revoked("token-of-tenant-b-0001".into(), grant));
        let early = tokio::time::timeout(Duration::from_millis(50), gone.as_mut()).await;
        assert!(early.is_err(), "resolved while the token was still there");
        let sources = Sources {
            fixed: vec!["a:token-of-tenant-a-0001".into()],
            file: None,
        };
        tokens.reload(&sources).unwrap();
        gone.await;
    }
}
