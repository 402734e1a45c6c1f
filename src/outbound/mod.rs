//! The one way out: every request waitd makes to a host it does not run (a wait's
//! target, a webhook's receiver, a token endpoint) goes through here.
//!
//! - [`guard`]: the SSRF guard, and the resolver that is the only way a name becomes
//!   an address, so the address judged is the address connected to.
//! - [`Client`]: one hyper client under that resolver, with its TLS settings; no
//!   proxy, no redirects, no retries.
//! - [`TlsClients`]: a client per distinct TLS setting of one's own (authorities to
//!   trust, a client certificate), shared by everyone who holds that setting.
//! - [`Error`]: why a request came to nothing, whether that may pass
//!   ([`Error::is_transient`]), and a sentence that never holds the URL or a header
//!   value.
//! - [`credentials`]: the credentials the operator holds, named, for the
//!   tenants it lists (`--credentials-file`).
//! - [`token`]: bearer tokens minted by the OAuth 2.0 client-credentials grant
//!   for the waits that ask for them, shared by waits of one tenant and credential.
//! - [`rate`]: `--host-rate`, requests to one host spaced by the replicas' share.
//! - [`KeyedSlots`]: the bound on how many at once per key (a host, a tenant's
//!   receiver, a tenant), which the API's stream caps use as well.
//!
//! It knows nothing of waits, deliveries or storage: what an answer means is the
//! caller's.

mod client;
pub mod credentials;
mod error;
pub mod guard;
pub mod rate;
mod slots;
mod tls;
pub mod token;

pub use client::{
    Body, Client, MAX_RETRY_AFTER, TlsError, USER_AGENT, drain, read_body, retry_after,
};
pub use error::{Error, Peer, error_chain};
pub use guard::{Guard, GuardedResolver, ResolveError};
pub use slots::{Full, KeyedSlots, Slot};
pub use tls::{TlsClient, TlsClients, TlsDigest, TlsSettings};
