//! The SSRF guard: which targets waitd may poll.
//!
//! A wait makes waitd send GETs on a client's behalf, so by default waitd refuses
//! targets inside the network it runs in: loopback, RFC 1918 private, link-local
//! (where cloud metadata lives, 169.254.169.254), carrier-grade NAT, unique-local,
//! multicast, unspecified, broadcast and other reserved ranges, and the `localhost`
//! names. IPv6 forms that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`,
//! IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are judged by
//! the IPv4 address they carry.
//!
//! Two checks, one rule set:
//! - [`Guard::check_url`] at creation and before every probe: a URL whose host is a
//!   forbidden address literal (or `localhost`) is refused outright. The `url` crate
//!   has already normalised the odd IPv4 spellings (`2130706433`, `0x7f.1`, `0177.1`)
//!   into addresses, so they are judged as the address they mean.
//! - [`GuardedResolver`], the outbound client's DNS resolver: a name is resolved once, the
//!   forbidden addresses are dropped, and only what remains is handed to the connector,
//!   so the address checked is the address connected to (DNS rebinding gets nowhere).
//!   A name left with no address fails with [`ResolveError::Forbidden`].
//!
//! The operator's allow-list (`--allow-targets`) opens exactly what it names: a host
//! name (`api.internal`), the subdomains of a suffix (`*.svc.cluster.local`, which does
//! not open `svc.cluster.local` itself), an address (`127.0.0.1`, `::1`) or a CIDR
//! range (`10.0.0.0/8`, `fd00::/8`). An allowed name may resolve to any address; an
//! allowed address or range may be reached under any name.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use crate::config::SettingError;
use url::{Host, Url};

/// What to do about a refusal, appended to every refusal sentence.
const ADVICE: &str = "waitd does not poll loopback, private, link-local or other internal addresses unless the operator allows them with --allow-targets (WAITD_ALLOW_TARGETS)";

/// The guard's refusal of a target: a sentence naming the host and why, and how an
/// operator opens it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(String);

/// The SSRF guard. The default guard allows nothing extra: every internal address is
/// refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guard {
    allow: Vec<Rule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    /// Exactly this host name (lowercase, no trailing dot).
    Host(String),
    /// Any subdomain of this suffix; stored with its leading dot (`.example.com`).
    Suffix(String),
    /// An address (a /32 or /128) or a CIDR range.
    Net(Net),
}

/// An address range (host bits cleared), as `ipnet` keeps it.
type Net = ipnet::IpNet;

fn net(addr: IpAddr, prefix: u8) -> Net {
    // `prefix` was checked against the address family by the caller.
    Net::new(addr, prefix)
        .map(|n| n.trunc())
        .unwrap_or_else(|_| Net::from(addr))
}

/// A host name as compared: lowercase, without the trailing dot of a fully
/// qualified name.
fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

impl Guard {
    /// Builds the guard from the operator's allow-list entries: host names,
    /// `*.suffix`es, IP addresses and CIDR ranges. Blank entries are skipped; anything
    /// else that is none of these is refused with a sentence naming the entry.
    pub fn new(entries: &[String]) -> Result<Guard, SettingError> {
        let mut allow = Vec::new();
        for entry in entries {
            let e = entry.trim();
            if e.is_empty() {
                continue;
            }
            allow.push(parse_rule(e)?);
        }
        Ok(Guard { allow })
    }

    /// Whether the allow-list names this host (a name, not an address).
    pub fn allows_host(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.allow.iter().any(|rule| match rule {
            Rule::Host(h) => *h == host,
            Rule::Suffix(s) => host.ends_with(s.as_str()),
            Rule::Net(_) => false,
        })
    }

    /// Whether the allow-list covers this address (or the IPv4 address it carries).
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        let carried = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        self.allow.iter().any(|rule| match rule {
            Rule::Net(n) => n.contains(&ip) || carried.is_some_and(|v4| n.contains(&v4)),
            _ => false,
        })
    }

    /// Refuses a URL that is not http(s), has no host, or whose host is a forbidden
    /// address literal or a `localhost` name, unless the allow-list opens it. A host
    /// name is otherwise let through here: its addresses are judged when it is
    /// resolved, by [`GuardedResolver`]. The error is a sentence a person can act on.
    ///
    /// A `dns://` URL's host is the name asked about, which waitd never connects
    /// to: only the resolver it names, if any, is judged (the operator's own
    /// resolver is the operator's choice).
    pub fn check_url(&self, url: &Url) -> Result<(), Refused> {
        if !matches!(
            url.scheme(),
            "http" | "https" | "tcp" | "tls" | "grpc" | "dns"
        ) {
            return Err(Refused(format!(
                "the target URL uses the scheme \"{}\"; only http, https, tcp, tls, grpc and dns can be polled",
                url.scheme()
            )));
        }
        if url.scheme() == "dns" {
            let resolver = url.query_pairs().find(|(k, _)| k == "resolver");
            return match resolver {
                None => Ok(()),
                Some((_, at)) => match Url::parse(&format!("http://{at}/")) {
                    Ok(at) => self.check_url(&at),
                    Err(_) => Err(Refused("the resolver is not HOST:PORT".to_string())),
                },
            };
        }
        match url.host() {
            None => Err(Refused("the target URL has no host".to_string())),
            // A tcp:// URL's host is opaque to the URL parser: an address in it
            // is still an address.
            Some(Host::Domain(domain)) if domain.parse::<IpAddr>().is_ok() => {
                self.check_literal(domain.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])))
            }
            Some(Host::Domain(domain)) => {
                let host = normalize_host(domain);
                if self.allows_host(&host) {
                    return Ok(());
                }
                if host == "localhost" || host.ends_with(".localhost") {
                    return Err(Refused(format!(
                        "the target host {host} names this machine (localhost); {ADVICE}"
                    )));
                }
                Ok(())
            }
            Some(Host::Ipv4(ip)) => self.check_literal(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => self.check_literal(IpAddr::V6(ip)),
        }
    }

    fn check_literal(&self, ip: IpAddr) -> Result<(), Refused> {
        if self.allows_ip(ip) {
            return Ok(());
        }
        match forbidden_reason(ip) {
            Some(reason) => Err(Refused(format!("the target host {reason}; {ADVICE}"))),
            None => Ok(()),
        }
    }

    /// Whether waitd may connect to `ip`, an address `host` resolved to: yes when the
    /// allow-list names the host or covers the address, or when the address is not a
    /// forbidden one. The error is a sentence a person can act on.
    pub fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), Refused> {
        match self.refusal(host, ip) {
            Some(reason) => Err(Refused(format!(
                "the host {} resolves to {reason}; {ADVICE}",
                normalize_host(host)
            ))),
            None => Ok(()),
        }
    }

    /// Why `host`'s address `ip` is refused (a clause such as "127.0.0.1 is a loopback
    /// address"), or `None` when it may be connected to.
    fn refusal(&self, host: &str, ip: IpAddr) -> Option<String> {
        if self.allows_host(host) || self.allows_ip(ip) {
            return None;
        }
        forbidden_reason(ip)
    }
}

fn parse_rule(entry: &str) -> Result<Rule, SettingError> {
    let e = entry.to_ascii_lowercase();
    if e.contains("://") {
        return Err(format!(
            "\"{entry}\" in --allow-targets is a URL; list its host name instead (e.g. api.internal)"
        ).into());
    }
    if e == "*" || e == "*." {
        return Err(format!(
            "\"{entry}\" in --allow-targets would open every host; list hosts, *.suffixes, addresses or ranges (0.0.0.0/0 and ::/0 open every address)"
        ).into());
    }
    if let Some((addr, prefix)) = e.split_once('/') {
        let addr = addr.trim_start_matches('[').trim_end_matches(']');
        let bad = || {
            format!(
                "\"{entry}\" in --allow-targets is not a CIDR range such as 10.0.0.0/8 or fd00::/8"
            )
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(format!(
                "\"{entry}\" in --allow-targets has a prefix length of {prefix}; an IPv{} range allows at most {max}",
                if addr.is_ipv4() { 4 } else { 6 }
            ).into());
        }
        return Ok(Rule::Net(net(addr, prefix)));
    }
    let bare = e.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        return Ok(Rule::Net(net(ip, prefix)));
    }
    let not_a_host = || {
        format!(
            "\"{entry}\" in --allow-targets is not a host name, *.suffix, IP address or CIDR range (write e.g. api.internal, *.svc.cluster.local, 10.1.2.3 or 10.0.0.0/8; no scheme or port)"
        )
    };
    if let Some(suffix) = e.strip_prefix("*.") {
        return match Host::parse(suffix) {
            Ok(Host::Domain(d)) if !d.contains('*') => {
                Ok(Rule::Suffix(format!(".{}", normalize_host(&d))))
            }
            Ok(_) => Err(format!(
                "\"{entry}\" in --allow-targets puts a wildcard before an address; a *.suffix needs a domain name"
            ).into()),
            Err(_) => Err(not_a_host().into()),
        };
    }
    // The WHATWG host parser, as `url` applies it to http URLs: it turns the odd IPv4
    // spellings into addresses and international names into their xn-- form, so a
    // rule compares equal to the host of a parsed URL.
    match Host::parse(&e) {
        Ok(Host::Domain(d)) if !d.contains('*') && !d.is_empty() => {
            Ok(Rule::Host(normalize_host(&d)))
        }
        Ok(Host::Ipv4(ip)) => Ok(Rule::Net(net(IpAddr::V4(ip), 32))),
        Ok(Host::Ipv6(ip)) => Ok(Rule::Net(net(IpAddr::V6(ip), 128))),
        _ => Err(not_a_host().into()),
    }
}

/// Why an address is forbidden, as a clause naming it ("127.0.0.1 is a loopback
/// address"), or `None` for an ordinary public address.
pub fn forbidden_reason(ip: IpAddr) -> Option<String> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4).map(|r| format!("{v4} is {r}")),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => {
                v4_reason(v4).map(|r| format!("{v6} is {r} (it carries the IPv4 address {v4})"))
            }
            None => v6_reason(v6).map(|r| format!("{v6} is {r}")),
        },
    }
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    let reason = if ip.is_broadcast() {
        "the broadcast address"
    } else if ip.is_unspecified() {
        "the unspecified address"
    } else if o[0] == 0 {
        "in 0.0.0.0/8, which means this host"
    } else if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_private() {
        "a private (RFC 1918) address"
    } else if ip == Ipv4Addr::new(169, 254, 169, 254) {
        "the link-local cloud metadata address"
    } else if ip.is_link_local() {
        "a link-local address"
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        "a carrier-grade NAT (100.64.0.0/10) address"
    } else if ip.is_multicast() {
        "a multicast address"
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        "a reserved IETF protocol (192.0.0.0/24) address"
    } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
        "a reserved benchmarking (198.18.0.0/15) address"
    } else if o[0] >= 240 {
        "a reserved (240.0.0.0/4) address"
    } else {
        return None;
    };
    Some(reason)
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    let reason = if ip.is_unspecified() {
        "the unspecified address"
    } else if ip.is_loopback() {
        "a loopback address"
    } else if s[0] & 0xfe00 == 0xfc00 {
        "a unique-local (fc00::/7) address"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "a link-local (fe80::/10) address"
    } else if s[0] & 0xffc0 == 0xfec0 {
        "a site-local (fec0::/10) address"
    } else if s[0] & 0xff00 == 0xff00 {
        "a multicast address"
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        "a local-use NAT64 (64:ff9b:1::/48) address"
    } else {
        return None;
    };
    Some(reason)
}

/// The IPv4 address an IPv6 address carries: IPv4-mapped (`::ffff:a.b.c.d`),
/// IPv4-compatible (`::a.b.c.d`, but not `::` or `::1`), NAT64 (`64:ff9b::/96`) and
/// 6to4 (`2002:aabb:ccdd::/48`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback() {
        return Some(low(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(low(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(low(s[1], s[2]));
    }
    None
}

/// Why a name could not be resolved to an address waitd may connect to.
#[derive(Debug)]
pub enum ResolveError {
    /// Every address the name resolved to is forbidden: an SSRF refusal, not worth
    /// retrying.
    Forbidden { host: String, reasons: Vec<String> },
    /// The lookup itself failed (no such name, no DNS server…): perhaps transient.
    Lookup { host: String, error: std::io::Error },
    /// The lookup succeeded with no address at all.
    NoAddresses { host: String },
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::Forbidden { host, reasons } => write!(
                f,
                "the host {host} resolves only to forbidden addresses ({}); {ADVICE}",
                reasons.join("; ")
            ),
            ResolveError::Lookup { host, error } => {
                write!(f, "could not resolve the host {host}: {error}")
            }
            ResolveError::NoAddresses { host } => {
                write!(f, "the host {host} resolves to no addresses")
            }
        }
    }
}

impl std::error::Error for ResolveError {}

/// The outbound client's DNS resolver: resolves with the system resolver (tokio's
/// `lookup_host`), or with a fixed override for tests, and keeps only the addresses the
/// [`Guard`] lets through. Installed on the client, it is the only way a name
/// becomes an address there, so the address checked is the one connected to.
#[derive(Clone, Debug)]
pub struct GuardedResolver {
    guard: Arc<Guard>,
    overrides: Arc<HashMap<String, Vec<SocketAddr>>>,
}

impl GuardedResolver {
    /// `overrides` map host names to fixed addresses instead of asking DNS (port 0
    /// means the URL's port); the guard judges them like any other answer.
    pub fn new(guard: Arc<Guard>, overrides: &[(String, SocketAddr)]) -> GuardedResolver {
        let mut map: HashMap<String, Vec<SocketAddr>> = HashMap::new();
        for (host, addr) in overrides {
            map.entry(normalize_host(host)).or_default().push(*addr);
        }
        GuardedResolver {
            guard,
            overrides: Arc::new(map),
        }
    }

    /// The addresses of `host` that waitd may connect to, in resolver order.
    pub async fn resolve_host(&self, host: &str) -> Result<Vec<SocketAddr>, ResolveError> {
        let host = normalize_host(host);
        let found: Vec<SocketAddr> = match self.overrides.get(&host) {
            Some(addrs) => addrs.clone(),
            None => tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|error| ResolveError::Lookup {
                    host: host.clone(),
                    error,
                })?
                .collect(),
        };
        if found.is_empty() {
            return Err(ResolveError::NoAddresses { host });
        }
        let mut kept = Vec::new();
        let mut reasons: Vec<String> = Vec::new();
        for addr in found {
            match self.guard.refusal(&host, addr.ip()) {
                None => {
                    if !kept.contains(&addr) {
                        kept.push(addr);
                    }
                }
                Some(reason) => {
                    if !reasons.contains(&reason) {
                        reasons.push(reason);
                    }
                }
            }
        }
        if kept.is_empty() {
            return Err(ResolveError::Forbidden { host, reasons });
        }
        if !reasons.is_empty() {
            tracing::debug!(%host, dropped = %reasons.join("; "), "dropped forbidden addresses");
        }
        Ok(kept)
    }
}

/// The outbound client (hyper's) resolves through this.
impl tower_service::Service<hyper_util::client::legacy::connect::dns::Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = ResolveError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, ResolveError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ResolveError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.resolve_host(name.as_str()).await.map(Vec::into_iter) })
    }
}

#[cfg(test)]
mod tests;
