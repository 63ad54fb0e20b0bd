//! `listeners:` and `access:` in `sluice.yaml`: how every listener defends itself (connection
//! caps, timeouts, load shedding, size limits) and who may call what (bearer tokens).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::Spanned;

use crate::duration::{Bounds, bounded_count, bounded_duration};
use crate::error::Located;
use crate::raw::{RawAccess, RawListeners};

/// Protection of every listener (HTTP API, gRPC, admin, gateways). The defaults hold a
/// slowloris or idle-connection flood off without any setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Open connections per listener (`max_connections`, default 10,000); more are closed as
    /// soon as they are accepted. Each gateway counts as one listener over all its workers.
    pub max_connections: usize,
    /// Whether `max_connections` was written in the file: a default that does not fit the
    /// open-file limit is fitted to it quietly, a written one that does not fit is a warning.
    pub max_connections_written: bool,
    /// Open connections on the admin listener (`admin_max_connections`, default 64), kept
    /// apart so that `/healthz` answers while the others are flooded.
    pub admin_max_connections: usize,
    /// Requests served at once per listener (`max_requests_in_flight`, default 4,096); more
    /// are answered at once with 503 (gRPC: `RESOURCE_EXHAUSTED`) instead of queueing. A
    /// request takes its slot only once its body has arrived (or, at a gateway, its first
    /// `max_body_bytes`), so a client that never finishes a body holds no slot.
    pub max_requests_in_flight: usize,
    /// Time for a client to send a request's body once its head has arrived
    /// (`body_read_timeout`, default 10 s; a gateway waits for the first `max_body_bytes`
    /// only); then 408 (gRPC: `CANCELLED`).
    pub body_read_timeout: Duration,
    /// Requests whose body is still arriving, per listener (`max_bodies_waiting`, default
    /// 16,384). Beyond it the request that has waited longest is answered 408 and dropped,
    /// so held streams cannot lock newer requests out.
    pub max_bodies_waiting: usize,
    /// Bytes buffered for bodies still arriving, per listener (`max_waiting_body_bytes`,
    /// default 64 MiB); beyond it the longest-waiting requests are dropped as above.
    pub max_waiting_body_bytes: usize,
    /// Time for a client to send a whole request head (`header_read_timeout`, default 10 s);
    /// it also bounds how long an HTTP/1 keep-alive connection waits for its next request.
    pub header_read_timeout: Duration,
    /// A connection with no bytes in either direction for this long is closed
    /// (`idle_timeout`, default 60 s; HTTP/2 and gRPC connections too).
    pub idle_timeout: Duration,
    /// Time to answer one request, its body included (`request_timeout`, default 30 s); then
    /// 408 (gRPC: `CANCELLED`). A gateway's `upstream_timeout` applies as well.
    pub request_timeout: Duration,
    /// Largest HTTP/1 request head and HTTP/2 header list (`max_header_bytes`, default 64 KiB,
    /// at least 8 KiB).
    pub max_header_bytes: usize,
    /// Largest request body of the JSON APIs (`max_body_bytes`, default 1 MiB); 413 beyond.
    pub max_body_bytes: usize,
    /// Concurrent HTTP/2 streams per connection (`http2_max_concurrent_streams`, default 128).
    pub http2_max_concurrent_streams: u32,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_connections_written: false,
            admin_max_connections: 64,
            max_requests_in_flight: 4_096,
            body_read_timeout: Duration::from_secs(10),
            max_bodies_waiting: 16_384,
            max_waiting_body_bytes: 64 * 1024 * 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            max_header_bytes: 64 * 1024,
            max_body_bytes: 1024 * 1024,
            http2_max_concurrent_streams: 128,
        }
    }
}

/// Bearer tokens, each read from a file (its content, surrounding whitespace removed). A
/// listener whose token is unset is open to whoever reaches its address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Token for the admin endpoints (`admin_token_file`); `/healthz` and `/readyz` stay open
    /// for probes.
    pub admin_token_file: Option<PathBuf>,
    /// Token for the HTTP API (`/v1/*`, `/json`) and the gRPC service (`api_token_file`).
    pub api_token_file: Option<PathBuf>,
    /// TLS on every listener (`tls_cert_file` and `tls_key_file`); plain TCP when unset.
    pub tls: Option<TlsFiles>,
    /// Host names the admin listener answers to besides IP addresses and `localhost`
    /// (`admin_hosts`, lower case, without port; `*` for any). Checked when no admin token is
    /// set, so that a web page cannot read the admin endpoints through DNS rebinding.
    pub admin_hosts: Vec<String>,
    /// Whether the status page shows rule keys in full (`status_full_keys`, default false:
    /// a value longer than 16 bytes that is not an IP address is shown as its first 6
    /// characters and a fingerprint, as it may be an API key taken from a header).
    pub status_full_keys: bool,
}

/// A certificate chain and its private key, PEM files, served by every listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

fn count(
    field: &str,
    value: Option<&Spanned<i64>>,
    default: usize,
    min: i64,
) -> Result<usize, Located> {
    let field = format!("listeners.{field}");
    bounded_count(&field, value, default as u64, (min, 100_000_000), "").map(|n| n as usize)
}

fn timeout(
    field: &str,
    value: Option<&Spanned<String>>,
    default: Duration,
) -> Result<Duration, Located> {
    let bounds = Bounds {
        min: Duration::from_millis(1),
        max: Duration::from_secs(86_400),
        range: "1ms and 1d",
        example: "`10s`, `500ms` or `1m`",
    };
    bounded_duration(&format!("listeners.{field}"), value, default, &bounds)
}

pub(crate) fn parse_listeners(raw: &RawListeners) -> Result<ListenerLimits, Located> {
    let d = ListenerLimits::default();
    Ok(ListenerLimits {
        max_connections: count(
            "max_connections",
            raw.max_connections.as_ref(),
            d.max_connections,
            1,
        )?,
        max_connections_written: raw.max_connections.is_some(),
        admin_max_connections: count(
            "admin_max_connections",
            raw.admin_max_connections.as_ref(),
            d.admin_max_connections,
            1,
        )?,
        max_requests_in_flight: count(
            "max_requests_in_flight",
            raw.max_requests_in_flight.as_ref(),
            d.max_requests_in_flight,
            1,
        )?,
        body_read_timeout: timeout(
            "body_read_timeout",
            raw.body_read_timeout.as_ref(),
            d.body_read_timeout,
        )?,
        max_bodies_waiting: count(
            "max_bodies_waiting",
            raw.max_bodies_waiting.as_ref(),
            d.max_bodies_waiting,
            1,
        )?,
        max_waiting_body_bytes: count(
            "max_waiting_body_bytes",
            raw.max_waiting_body_bytes.as_ref(),
            d.max_waiting_body_bytes,
            1024,
        )?,
        header_read_timeout: timeout(
            "header_read_timeout",
            raw.header_read_timeout.as_ref(),
            d.header_read_timeout,
        )?,
        idle_timeout: timeout("idle_timeout", raw.idle_timeout.as_ref(), d.idle_timeout)?,
        request_timeout: timeout(
            "request_timeout",
            raw.request_timeout.as_ref(),
            d.request_timeout,
        )?,
        max_header_bytes: count(
            "max_header_bytes",
            raw.max_header_bytes.as_ref(),
            d.max_header_bytes,
            8192,
        )?,
        max_body_bytes: count(
            "max_body_bytes",
            raw.max_body_bytes.as_ref(),
            d.max_body_bytes,
            1,
        )?,
        http2_max_concurrent_streams: count(
            "http2_max_concurrent_streams",
            raw.http2_max_concurrent_streams.as_ref(),
            d.http2_max_concurrent_streams as usize,
            1,
        )?
        .min(u32::MAX as usize) as u32,
    })
}

pub(crate) fn parse_access(raw: &RawAccess, base: &Path) -> Result<Access, Located> {
    let file = |field: &str, value: Option<&Spanned<String>>| -> Result<Option<PathBuf>, Located> {
        let holds = if field.starts_with("tls") {
            "a PEM file"
        } else {
            "a file that holds the token"
        };
        match value {
            None => Ok(None),
            Some(v) if v.value.trim().is_empty() => Err(Located::at(
                v,
                format!("access.{field} is empty; write the path of {holds}"),
            )),
            Some(v) => Ok(Some(base.join(v.value.trim()))),
        }
    };
    let cert = file("tls_cert_file", raw.tls_cert_file.as_ref())?;
    let key = file("tls_key_file", raw.tls_key_file.as_ref())?;
    let tls = match (cert, key) {
        (Some(cert_file), Some(key_file)) => Some(TlsFiles {
            cert_file,
            key_file,
        }),
        (None, None) => None,
        (Some(_), None) => {
            return Err(Located::at(
                raw.tls_cert_file.as_ref().expect("set"),
                "access.tls_cert_file is set without access.tls_key_file; set both (PEM files) or neither".to_owned(),
            ));
        }
        (None, Some(_)) => {
            return Err(Located::at(
                raw.tls_key_file.as_ref().expect("set"),
                "access.tls_key_file is set without access.tls_cert_file; set both (PEM files) or neither".to_owned(),
            ));
        }
    };
    let mut admin_hosts = Vec::new();
    for host in raw.admin_hosts.iter().flatten() {
        let name = host.value.trim().to_ascii_lowercase();
        let valid = name == "*"
            || (!name.is_empty()
                && name.len() <= 253
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
        if !valid {
            return Err(Located::at(
                host,
                format!(
                    "access.admin_hosts: `{}` is not a host name; write a name such as `sluice.internal` (no port, no scheme), or `*` for any",
                    host.value.chars().take(64).collect::<String>()
                ),
            ));
        }
        admin_hosts.push(name);
    }
    Ok(Access {
        admin_token_file: file("admin_token_file", raw.admin_token_file.as_ref())?,
        api_token_file: file("api_token_file", raw.api_token_file.as_ref())?,
        tls,
        admin_hosts,
        status_full_keys: raw.status_full_keys.unwrap_or(false),
    })
}
