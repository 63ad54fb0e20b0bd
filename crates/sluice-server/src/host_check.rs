//! DNS rebinding defence of the admin listener. A web page the operator opens can make the
//! browser send requests to the admin address under a name the attacker controls (resolved to
//! 127.0.0.1 after the page loaded) and read the answers as same-origin. Such a request names
//! the attacker's host in `Host`; the admin endpoints therefore answer only to an IP address,
//! `localhost` or a name listed in `access.admin_hosts` when no admin token is set (a token
//! already keeps the page out: the browser does not have it). Probes stay open.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

/// The names the admin listener answers to, besides IP addresses and `localhost`.
#[derive(Clone, Debug, Default)]
pub(crate) struct AllowedHosts {
    names: Arc<[String]>,
}

impl AllowedHosts {
    pub(crate) fn new(names: &[String]) -> Self {
        Self {
            names: names.iter().map(|n| n.to_ascii_lowercase()).collect(),
        }
    }

    /// Whether a request naming `host` (as sent: maybe with a port, an IPv6 address in
    /// brackets) may be answered.
    pub(crate) fn allows(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            Some(rest) => rest.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(name, _)| name),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || self.names.iter().any(|n| n == "*" || *n == name)
    }
}

/// Refuses requests whose `Host` (or HTTP/2 `:authority`) is not allowed, with 421.
pub(crate) async fn require_known_host(
    State(allowed): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or("");
    if allowed.allows(host) {
        return next.run(request).await;
    }
    metrics::counter!("sluice_admin_host_refused_total").increment(1);
    (
        StatusCode::MISDIRECTED_REQUEST,
        "the admin listener answers only to its IP address, localhost or a name in access.admin_hosts (or set access.admin_token_file)\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_localhost_and_listed_names_pass_and_other_names_do_not() {
        let allowed = AllowedHosts::new(&["sluice.internal".to_owned()]);
        for ok in [
            "127.0.0.1:9090",
            "127.0.0.1",
            "[::1]:9090",
            "10.1.2.3",
            "localhost:9090",
            "LOCALHOST",
            "sluice.internal:9090",
            "Sluice.Internal.",
        ] {
            assert!(allowed.allows(ok), "{ok}");
        }
        for refused in [
            "",
            "evil.example:9090",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "sluice.internal.evil.example",
            "[evil]",
        ] {
            assert!(!allowed.allows(refused), "{refused}");
        }
        assert!(AllowedHosts::new(&["*".to_owned()]).allows("anything.example"));
    }
}
