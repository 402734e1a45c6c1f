//! The API tokens in force: which tenant each names and what it may do, and their
//! reloading without a restart (on `SIGHUP`, and when `--tokens-file` changes).
//!
//! An entry is `tenant:token` (full access) or `tenant:token:read` (read-only:
//! reads, lists and streams; no create, cancel or redelivery). A reload that fails
//! (a file that cannot be read, an entry that is malformed, or no tokens left
//! where there were some, which would open the API to anyone) keeps the tokens in
//! force and logs why. It never reads the file more than once a second, and reads
//! it off the runtime's threads ([`crate::files`]).
//!
//! The file is read strictly ([`parse`]): a line read loosely would move a tenant
//! (a byte-order mark made `a` into `\u{feff}a`) or widen a token (a mistyped
//! `:readonly` made a full-access token of `TOKEN:readonly`).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::SettingError;
use crate::signals::{Signal, Signals};

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
const READ_SUFFIX: &str = "read";

/// Shortest token accepted.
pub const MIN_TOKEN: usize = 16;

/// Longest token accepted.
pub const MAX_TOKEN: usize = 4096;

/// Longest tenant name.
pub const MAX_TENANT: usize = 64;

/// The largest tokens file read.
pub const MAX_FILE: usize = 1024 * 1024;

/// How often `--tokens-file` is looked at for a change (its modification time and
/// length).
pub const FILE_CHECK: Duration = Duration::from_secs(1);

/// Whether `name` may name a tenant: 1 to 64 of letters, digits, `.`, `_` and `-`.
pub fn is_tenant_name(name: &str) -> bool {
    (1..=MAX_TENANT).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Reads entries, each `tenant:token` or `tenant:token:read`, `at(i)` naming the
/// `i`th (from 0) in a sentence. Empty lines and lines that begin with `#` are
/// skipped. Everything else is read strictly, since a line read loosely moves a
/// tenant or widens a token: a byte-order mark, whitespace or a control character
/// anywhere, a tenant name outside `[A-Za-z0-9._-]`, a token of characters a
/// header cannot carry, or a suffix other than `:read` is refused, and the
/// sentence never holds the line (it may hold a token).
pub fn parse<S: AsRef<str>>(
    lines: &[S],
    at: impl Fn(usize) -> String,
) -> Result<TokenSet, SettingError> {
    let mut tokens = TokenSet::new();
    for (i, line) in lines.iter().enumerate() {
        let line = line.as_ref();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (token, grant) =
            entry(line).map_err(|why| SettingError(format!("{}: {why}", at(i))))?;
        if tokens.insert(token.to_string(), grant).is_some() {
            return Err(SettingError(format!(
                "{}: repeats a token given before it",
                at(i)
            )));
        }
    }
    Ok(tokens)
}

sentence_error! {
    /// Why a line of the tokens is not an entry; the sentence follows where it is.
    struct EntryError;
}

/// One entry: its token and grant, or why it is not one.
fn entry(line: &str) -> Result<(&str, Grant), EntryError> {
    if line.starts_with('\u{feff}') {
        return Err(
            "begins with a byte-order mark (U+FEFF); save the file as UTF-8 without one".into(),
        );
    }
    if let Some(c) = line.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "holds {}; an entry is tenant:token or tenant:token:read with nothing around it",
            match c {
                '\r' => "a carriage return (a file written with Windows line ends?)".to_string(),
                c if c.is_whitespace() => format!("whitespace (U+{:04X})", u32::from(c)),
                c => format!("a control character (U+{:04X})", u32::from(c)),
            }
        )
        .into());
    }
    let mut parts = line.split(':');
    let (tenant, token) = match (parts.next(), parts.next()) {
        (Some(t), Some(k)) => (t, k),
        _ => return Err("is not tenant:token (or tenant:token:read)".into()),
    };
    let access = match (parts.next(), parts.next()) {
        (None, _) => Access::Full,
        (Some(READ_SUFFIX), None) => Access::Read,
        _ => {
            return Err(
                "has a suffix waitd does not know: after tenant:token, the only one is \":read\" (a token holds no ':')"
                    .into(),
            );
        }
    };
    if !is_tenant_name(tenant) {
        return Err(format!(
            "the tenant name is not 1 to {MAX_TENANT} of letters, digits, '.', '_' and '-'"
        )
        .into());
    }
    if !(MIN_TOKEN..=MAX_TOKEN).contains(&token.len()) {
        return Err(format!("the token is not {MIN_TOKEN} to {MAX_TOKEN} characters long").into());
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the token holds characters other than printable ASCII, which no Authorization header carries".into());
    }
    Ok((
        token,
        Grant {
            tenant: tenant.to_string(),
            access,
        },
    ))
}

/// Where the tokens come from: the entries of `--tokens` (fixed for the process's
/// life) and the file of `--tokens-file` (read again on each reload).
#[derive(Clone, Debug, Default)]
pub struct Sources {
    fixed: Vec<String>,
    file: Option<PathBuf>,
}

impl Sources {
    pub fn of(config: &crate::config::Api) -> Sources {
        Sources {
            fixed: config.tokens.clone(),
            file: config.tokens_file.clone(),
        }
    }

    /// The tokens as the sources say now. The file is read off the runtime's
    /// threads, within [`crate::files::READ_WITHIN`].
    pub async fn load(&self) -> Result<TokenSet, SettingError> {
        // A setting may carry spaces around its entries (design §2.1); a file
        // may not.
        let fixed: Vec<&str> = self.fixed.iter().map(|e| e.trim()).collect();
        let mut set = parse(&fixed, |i| format!("--tokens entry {}", i + 1))?;
        if let Some(path) = &self.file {
            let text = crate::files::read_text(path, MAX_FILE)
                .await
                .map_err(|e| SettingError(format!("the tokens file {} {e}", path.display())))?;
            let lines: Vec<&str> = text.split('\n').collect();
            // A last line ended by its newline leaves an empty one after it.
            let from_file = parse(&lines, |i| {
                format!("the tokens file {}, line {}", path.display(), i + 1)
            })?;
            for (token, grant) in from_file {
                if set.insert(token, grant).is_some() {
                    return Err(SettingError(format!(
                        "the tokens file {} repeats a token of --tokens",
                        path.display()
                    )));
                }
            }
        }
        Ok(set)
    }

    /// The tokens file's stamp, to notice a change; `None` without a file, or
    /// when it cannot be looked at.
    pub async fn file_stamp(&self) -> Option<crate::files::Stamp> {
        crate::files::stamp(self.file.as_ref()?).await.ok()
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
    pub async fn reload(&self, sources: &Sources) -> Result<usize, SettingError> {
        let set = sources.load().await?;
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

    async fn reload_and_log(&self, sources: &Sources, why: &str, signals: &Signals) {
        let outcome = self.reload(sources).await;
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

    /// Reloads on `SIGHUP` and when the tokens file's stamp differs from
    /// `stamp` (taken before the tokens in force were read), until `stopped`.
    pub async fn watch(
        self,
        sources: Sources,
        mut stamp: Option<crate::files::Stamp>,
        signals: Signals,
        stopped: impl Future<Output = ()>,
    ) {
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
                    stamp = sources.file_stamp().await;
                    self.reload_and_log(&sources, "SIGHUP", &signals).await;
                }
                _ = tick.tick(), if sources.file.is_some() => {
                    let now = sources.file_stamp().await;
                    if now != stamp {
                        stamp = now;
                        self.reload_and_log(&sources, "the tokens file changed", &signals).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry_n(i: usize) -> String {
        format!("entry {}", i + 1)
    }

    #[test]
    fn an_entry_ending_in_read_is_a_read_only_token() {
        let set = parse(
            &[
                "a:token-of-tenant-a-0001",
                "# a comment",
                "",
                "dash:token-of-the-dashboard:read",
            ],
            entry_n,
        )
        .unwrap();
        assert_eq!(set["token-of-tenant-a-0001"].access, Access::Full);
        let dash = &set["token-of-the-dashboard"];
        assert_eq!((dash.tenant.as_str(), dash.access), ("dash", Access::Read));
        let short = parse(&["a:short:read"], entry_n).unwrap_err();
        assert!(short.0.contains("16 to 4096 characters"), "{short}");
        let twice = parse(
            &["a:token-of-tenant-a-0001", "b:token-of-tenant-a-0001:read"],
            entry_n,
        );
        assert!(twice.unwrap_err().0.contains("entry 2: repeats"));
    }

    #[tokio::test]
    async fn a_reload_to_no_tokens_is_refused_and_the_old_set_stays() {
        let tokens = Tokens::new(parse(&["a:token-of-tenant-a-0001"], entry_n).unwrap());
        let err = tokens.reload(&Sources::default()).await.unwrap_err();
        assert!(err.0.contains("anyone"), "{err}");
        assert_eq!(tokens.current().len(), 1);
    }

    #[tokio::test]
    async fn revoked_resolves_when_the_token_goes_and_not_before() {
        let tokens = Tokens::new(
            parse(
                &["a:token-of-tenant-a-0001", "b:token-of-tenant-b-0001"],
                entry_n,
            )
            .unwrap(),
        );
        let grant = tokens.current()["token-of-tenant-b-0001"].clone();
        let mut gone = std::pin::pin!(tokens.revoked("token-of-tenant-b-0001".into(), grant));
        let early = tokio::time::timeout(Duration::from_millis(50), gone.as_mut()).await;
        assert!(early.is_err(), "resolved while the token was still there");
        let sources = Sources {
            fixed: vec!["a:token-of-tenant-a-0001".into()],
            file: None,
        };
        tokens.reload(&sources).await.unwrap();
        gone.await;
    }

    /// A change to the file between start-up's read and the watcher's first
    /// look is reloaded: the watcher compares with the stamp of what was read,
    /// not with what it finds when it first runs.
    #[tokio::test]
    async fn a_change_before_the_watcher_first_runs_is_reloaded() {
        let dir = std::env::temp_dir().join(format!("waitd-tokens-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tokens");
        std::fs::write(&file, "a:token-of-tenant-a-0001\n").unwrap();
        let sources = Sources {
            fixed: vec![],
            file: Some(file.clone()),
        };
        let stamp = sources.file_stamp().await;
        let tokens = Tokens::new(sources.load().await.unwrap());
        let grant = tokens.current()["token-of-tenant-a-0001"].clone();
        let gone = tokens.revoked("token-of-tenant-a-0001".into(), grant);
        std::fs::write(&file, "a:token-of-tenant-a-0002-longer\n").unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let watcher = tokio::spawn(tokens.clone().watch(
            sources,
            stamp,
            Signals::default(),
            async move {
                let _ = stopped.await;
            },
        ));
        let reloaded = tokio::time::timeout(Duration::from_secs(20), gone).await;
        let _ = stop.send(());
        watcher.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(reloaded.is_ok(), "the change was never reloaded");
        assert!(
            tokens
                .current()
                .contains_key("token-of-tenant-a-0002-longer")
        );
    }
}
