//! Fields a `sluice.yaml` and its gateways both write: addresses, the rate-limit header style,
//! non-empty strings and the cost cap.

use std::net::SocketAddr;

use serde_saphyr::Spanned;

use crate::error::{Located, suggestion};

/// Which rate-limit headers HTTP responses carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
    Ietf,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    Legacy,
    /// Both.
    Both,
    /// None (429 and `Retry-After` only).
    None,
}

pub(crate) const MAX_COST: i64 = sluice_core::MAX_COST as i64;

/// A listener's address: `ip:port`, or `host:port` with a host name resolved now (to its
/// first IPv4 address, else its first: `localhost:8080` listens on 127.0.0.1:8080).
pub(crate) fn parse_addr(field: &str, value: &Spanned<String>) -> Result<SocketAddr, Located> {
    if let Ok(addr) = value.value.parse() {
        return Ok(addr);
    }
    let invalid = |why: &str| {
        Located::at(
            value,
            format!(
                "invalid {field} address `{}`{why}; write `host:port`, e.g. `127.0.0.1:8080`, `[::1]:8080` or `localhost:8080`",
                value.value
            ),
        )
    };
    let Some((host, port)) = value.value.rsplit_once(':') else {
        return Err(invalid(": no port"));
    };
    // Only a well-formed host name goes to the resolver (RFC 1123: letters, digits, `-` and
    // `.`, at most 253 characters).
    let host_name = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !host_name || port.parse::<u16>().is_err() {
        return Err(invalid(""));
    }
    let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(value.value.as_str())
        .map_err(|e| invalid(&format!(": `{host}` does not resolve ({e})")))?
        .collect();
    resolved
        .iter()
        .find(|a| a.is_ipv4())
        .or(resolved.first())
        .copied()
        .ok_or_else(|| invalid(&format!(": `{host}` resolves to no address")))
}

pub(crate) fn parse_headers(value: &Spanned<String>) -> Result<HeaderStyle, Located> {
    Ok(match value.value.as_str() {
        "ietf" => HeaderStyle::Ietf,
        "legacy" => HeaderStyle::Legacy,
        "both" => HeaderStyle::Both,
        "none" => HeaderStyle::None,
        other => {
            return Err(Located::at(
                value,
                format!(
                    "unknown headers style `{other}`; {}",
                    suggestion(other, &["ietf", "legacy", "both", "none"])
                ),
            ));
        }
    })
}

pub(crate) fn non_empty(field: &str, value: &Spanned<String>) -> Result<String, Located> {
    if value.value.trim().is_empty() {
        return Err(Located::at(value, format!("`{field}` is empty")));
    }
    Ok(value.value.clone())
}
