//! Where a credential's token may go: one entry of its `hosts` (a host, a host
//! and port, or a URL prefix), read from the file, and whether a target's URL is
//! one it admits.

use super::document::EntryError;

/// One entry of a credential's `hosts`.
#[derive(Debug)]
pub(super) enum Place {
    /// A host, on the port given or any.
    Host { host: String, port: Option<u16> },
    /// A URL prefix: that scheme, host and port, and a path under its path.
    Prefix {
        scheme: String,
        host: String,
        port: Option<u16>,
        path: String,
    },
}

impl Place {
    /// Reads one entry of `hosts`.
    pub(super) fn parse(entry: &str) -> Result<Place, EntryError> {
        let shape = "is a host (api.example.com), a host and port (api.example.com:8443) or a URL prefix (https://api.example.com/v1/)";
        if entry.is_empty() || entry.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("{shape}, with no whitespace").into());
        }
        if entry.contains("://") {
            let url = url::Url::parse(entry).map_err(|e| format!("{shape} ({e})"))?;
            if !matches!(url.scheme(), "http" | "https")
                || url.host_str().is_none_or(str::is_empty)
                || !url.username().is_empty()
                || url.password().is_some()
                || url.query().is_some()
                || url.fragment().is_some()
            {
                return Err(format!(
                    "{shape}: an http or https URL with a host, and no credentials, query or fragment"
                ).into());
            }
            return Ok(Place::Prefix {
                scheme: url.scheme().to_string(),
                host: url.host_str().unwrap_or_default().to_string(),
                port: url.port_or_known_default(),
                path: url.path().to_string(),
            });
        }
        if entry.contains(['/', '@', '?', '#', '\\']) {
            return Err(shape.into());
        }
        // The port as given (a URL forgets its scheme's own).
        let (host, port) = match entry.rsplit_once(':') {
            Some((host, port)) if !entry.ends_with(']') => (
                host,
                Some(port.parse::<u16>().map_err(|_| shape.to_string())?),
            ),
            _ => (entry, None),
        };
        let url =
            url::Url::parse(&format!("https://{host}/")).map_err(|e| format!("{shape} ({e})"))?;
        let host = url.host_str().unwrap_or_default();
        if host.is_empty() || url.port().is_some() {
            return Err(shape.into());
        }
        Ok(Place::Host {
            host: host.to_string(),
            port,
        })
    }

    /// Whether a request to `url` may carry the credential.
    pub(super) fn admits(&self, url: &url::Url) -> bool {
        let host = url.host_str().unwrap_or_default();
        match self {
            Place::Host { host: h, port } => {
                h.eq_ignore_ascii_case(host)
                    && port.is_none_or(|p| Some(p) == url.port_or_known_default())
            }
            Place::Prefix {
                scheme,
                host: h,
                port,
                path,
            } => {
                scheme == url.scheme()
                    && h.eq_ignore_ascii_case(host)
                    && *port == url.port_or_known_default()
                    && match url.path().strip_prefix(path.as_str()) {
                        Some(rest) => {
                            path.ends_with('/') || rest.is_empty() || rest.starts_with('/')
                        }
                        None => false,
                    }
            }
        }
    }
}
