//! `sluice.yaml`: the service configuration (docs/CONFIG.md).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_saphyr::Spanned;

use crate::error::{ConfigError, Located, suggestion};
use crate::raw::{RawAction, RawGateway, RawRoute, RawServiceFile};
use crate::rules::{RuleSet, RuleSettings, parse_settings};

/// Where counters are shared. Its `Debug` output never shows a password.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreConfig {
    /// The embedded in-memory store (one process).
    Memory,
    /// One Redis server: `redis://` or `rediss://` (TLS).
    Redis {
        /// The URL as written, credentials included.
        url: String,
    },
    /// Redis behind Sentinel.
    Sentinel {
        /// Sentinel addresses, `host:port`.
        sentinels: Vec<String>,
        /// The monitored master's name.
        master: String,
        /// TLS to the servers.
        tls: bool,
        /// ACL user and password for the data nodes.
        auth: Option<(Option<String>, String)>,
        /// Database number.
        db: u32,
        /// ACL user and password for the Sentinels (`?sentinel_username=..&sentinel_password=..`).
        sentinel_auth: Option<(Option<String>, String)>,
        /// TLS to the Sentinels (`?sentinel_tls=true`).
        sentinel_tls: bool,
    },
    /// Redis Cluster.
    Cluster {
        /// Seed node addresses, `host:port`.
        nodes: Vec<String>,
        /// TLS to the servers.
        tls: bool,
        /// ACL user and password.
        auth: Option<(Option<String>, String)>,
    },
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let login = |auth: &Option<(Option<String>, String)>| match auth {
            None => "none".to_owned(),
            Some((user, _)) => format!("{}:***", user.as_deref().unwrap_or("")),
        };
        match self {
            StoreConfig::Memory => f.write_str("Memory"),
            StoreConfig::Redis { url } => f
                .debug_struct("Redis")
                .field("url", &crate::redact_url(url))
                .finish(),
            StoreConfig::Sentinel {
                sentinels,
                master,
                tls,
                auth,
                db,
                sentinel_auth,
                sentinel_tls,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", sentinels)
                .field("master", master)
                .field("tls", tls)
                .field("auth", &login(auth))
                .field("db", db)
                .field("sentinel_auth", &login(sentinel_auth))
                .field("sentinel_tls", sentinel_tls)
                .finish(),
            StoreConfig::Cluster { nodes, tls, auth } => f
                .debug_struct("Cluster")
                .field("nodes", nodes)
                .field("tls", tls)
                .field("auth", &login(auth))
                .finish(),
        }
    }
}

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

/// The listeners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listen {
    /// HTTP/JSON API.
    pub http: SocketAddr,
    /// Envoy RLS gRPC.
    pub grpc: SocketAddr,
    /// Admin: metrics, health, reload.
    pub admin: SocketAddr,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc: SocketAddr::from(([127, 0, 0, 1], 8081)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9090)),
        }
    }
}

/// How a gateway route matches requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// Path starts with this.
    pub path_prefix: Option<String>,
    /// Path equals this.
    pub path: Option<String>,
    /// Path matches this template, e.g. `/users/{id}`.
    pub path_template: Option<String>,
    /// HTTP method, upper case.
    pub method: Option<String>,
}

/// How a request header is matched by `header_value_match`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderMatch {
    /// Equals.
    Exact(String),
    /// Starts with.
    Prefix(String),
    /// Ends with.
    Suffix(String),
    /// Contains.
    Contains(String),
    /// Is present (`true`) or absent (`false`).
    Present(bool),
}

/// One header condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderMatcher {
    /// Header name, lower case.
    pub name: String,
    /// The condition.
    pub matcher: HeaderMatch,
    /// Negates the condition.
    pub invert: bool,
}

/// An Envoy-style action: builds one entry of a descriptor from a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// A request header's value.
    RequestHeaders {
        /// Header name, lower case.
        header_name: String,
        /// Descriptor key.
        descriptor_key: String,
        /// Skip only this entry (not the whole descriptor) when the header is absent.
        skip_if_absent: bool,
    },
    /// The client address (`remote_address`).
    RemoteAddress,
    /// The client address masked to a prefix (`masked_remote_address`).
    MaskedRemoteAddress {
        /// IPv4 prefix length, 0..=32.
        v4_prefix_len: u8,
        /// IPv6 prefix length, 0..=128.
        v6_prefix_len: u8,
    },
    /// A constant entry.
    GenericKey {
        /// Descriptor key (default `generic_key`).
        descriptor_key: String,
        /// Descriptor value.
        descriptor_value: String,
    },
    /// A constant entry added when the headers match (or do not, with `expect_match: false`).
    HeaderValueMatch {
        /// Descriptor key (default `header_match`).
        descriptor_key: String,
        /// Descriptor value.
        descriptor_value: String,
        /// Whether the headers must match or must not.
        expect_match: bool,
        /// All must hold.
        headers: Vec<HeaderMatcher>,
    },
    /// A query parameter's value.
    QueryParameter {
        /// Parameter name.
        name: String,
        /// Descriptor key.
        descriptor_key: String,
        /// Skip only this entry when absent.
        skip_if_absent: bool,
    },
    /// The HTTP method.
    Method {
        /// Descriptor key (default `method`).
        descriptor_key: String,
    },
    /// The route's path template when it has one, else the path.
    Path {
        /// Descriptor key (default `path`).
        descriptor_key: String,
    },
}

/// A gateway route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Which requests it takes.
    pub matcher: RouteMatch,
    /// Cost of each request.
    pub cost: u64,
    /// Each entry builds one descriptor from its actions.
    pub rate_limits: Vec<Vec<Action>>,
}

/// A reverse-proxy gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gateway {
    /// Listen address.
    pub listen: SocketAddr,
    /// Upstream base URL (`http://host:port`).
    pub upstream: String,
    /// Domain its rules come from.
    pub domain: String,
    /// Header style (defaults to the top-level `headers`).
    pub headers: HeaderStyle,
    /// Routes, first match wins.
    pub routes: Vec<Route>,
    /// How long the upstream may take to send its response head (default 30 s; then 504).
    pub upstream_timeout: std::time::Duration,
    /// Threads serving it, each with its own listening socket (`SO_REUSEPORT`) and upstream
    /// connections (`workers`; `None`: one per CPU).
    pub workers: Option<std::num::NonZeroUsize>,
}

/// A validated `sluice.yaml` with its rule files loaded.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// The file.
    pub file: PathBuf,
    /// The store.
    pub store: StoreConfig,
    /// Listeners.
    pub listen: Listen,
    /// Rule files and directories, resolved against the config file's directory.
    pub rule_paths: Vec<PathBuf>,
    /// The loaded rules.
    pub rules: RuleSet,
    /// Settings for rules that do not set them.
    pub defaults: RuleSettings,
    /// Domain of `/v1/acquire` and `/v1/refill`.
    pub api_domain: String,
    /// Header style.
    pub headers: HeaderStyle,
    /// Gateways.
    pub gateways: Vec<Gateway>,
    /// The most instances the deployment runs (`expected_instances`, default 1): the `N` of
    /// the seed's MAX/N fallback, the share a newly started instance keeps to before it has
    /// heard from the store, and the split of `exact` mode's `on_store_error: local`.
    pub expected_instances: u64,
    /// The most keys (distinct descriptor values) a rule tracks on one instance
    /// (`max_keys_per_rule`, default 1,000,000); keys beyond it share the rule's fixed-size
    /// sketch. With keys of at most 128 bytes this bounds a rule's memory.
    pub max_keys_per_rule: usize,
    /// PEM root certificate(s) to trust for a `rediss://` store instead of the built-in web
    /// roots (`store_ca_file`, resolved against the config file's directory).
    pub store_ca_file: Option<PathBuf>,
    /// How every listener protects itself (`listeners:`).
    pub listeners: crate::ListenerLimits,
    /// Bearer tokens for the admin endpoints and the APIs (`access:`).
    pub access: crate::Access,
}

const MAX_COST: i64 = sluice_core::MAX_COST as i64;

/// `max_keys_per_rule` when the file does not set it.
pub const DEFAULT_MAX_KEYS_PER_RULE: usize = 1_000_000;

fn parse_addr(field: &str, value: &Spanned<String>) -> Result<SocketAddr, Located> {
    value.value.parse().map_err(|_| {
        Located::at(
            value,
            format!("invalid {field} address `{}`; write `host:port` with an IP, e.g. `127.0.0.1:8080` or `[::1]:8080`", value.value),
        )
    })
}

fn parse_headers(value: &Spanned<String>) -> Result<HeaderStyle, Located> {
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

fn split_authority(rest: &str) -> (Option<&str>, &str, Option<&str>) {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..], path),
        None => (None, authority, path),
    }
}

/// `user:password` or `password`, percent-decoded (a password may hold `@`, `/` or `:` as
/// `%40`, `%2F`, `%3A`).
fn parse_auth(userinfo: Option<&str>) -> Option<(Option<String>, String)> {
    let info = userinfo?;
    match info.split_once(':') {
        Some((user, pass)) => Some(((!user.is_empty()).then(|| decode(user)), decode(pass))),
        None => Some((None, decode(info))),
    }
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Sentinel URL options: `sentinel_username`, `sentinel_password`, `sentinel_tls`.
struct SentinelOptions {
    auth: Option<(Option<String>, String)>,
    tls: bool,
}

fn sentinel_options(value: &Spanned<String>, query: &str) -> Result<SentinelOptions, Located> {
    let (mut user, mut password, mut tls) = (None, None, false);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, v) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "sentinel_username" => user = Some(decode(v)),
            "sentinel_password" => password = Some(decode(v)),
            "sentinel_tls" => {
                tls = match v {
                    "true" | "yes" | "1" => true,
                    "false" | "no" | "0" => false,
                    other => {
                        return Err(Located::at(
                            value,
                            format!(
                                "invalid sentinel_tls `{other}` in store URL; write `sentinel_tls=true` or `false`"
                            ),
                        ));
                    }
                }
            }
            other => {
                return Err(Located::at(
                    value,
                    format!(
                        "unknown store URL option `{other}`; {}",
                        suggestion(
                            other,
                            &["sentinel_username", "sentinel_password", "sentinel_tls"]
                        )
                    ),
                ));
            }
        }
    }
    let auth = match (user, password) {
        (user, Some(password)) => Some((user, password)),
        (Some(_), None) => {
            return Err(Located::at(
                value,
                "store URL sets `sentinel_username` without `sentinel_password`",
            ));
        }
        (None, None) => None,
    };
    Ok(SentinelOptions { auth, tls })
}

fn parse_hosts(
    value: &Spanned<String>,
    hosts: &str,
    default_port: u16,
) -> Result<Vec<String>, Located> {
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(Located::at(
                value,
                format!(
                    "empty host in store URL `{}`; write `host:port` entries separated by commas",
                    crate::redact_url(&value.value)
                ),
            ));
        }
        let with_port = if host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !host.ends_with(']')
        {
            host.to_owned()
        } else {
            format!("{host}:{default_port}")
        };
        out.push(with_port);
    }
    Ok(out)
}

/// Parses a store URL (docs/CONFIG.md lists the forms).
pub(crate) fn parse_store(value: &Spanned<String>) -> Result<StoreConfig, Located> {
    let url = value.value.trim();
    // What error messages show: never the password.
    let shown = crate::redact_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Located::at(
            value,
            format!(
                "invalid store `{shown}`; write `memory://`, `redis://host:6379`, `rediss://host:6380`, `redis+sentinel://h1:26379,h2:26379/mymaster` or `redis+cluster://h1:7000,h2:7001`"
            ),
        ));
    };
    let schemes = [
        "memory",
        "redis",
        "rediss",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
    ];
    match scheme {
        "memory" => {
            if !rest.is_empty() {
                return Err(Located::at(
                    value,
                    "the memory store takes no address; write `memory://`",
                ));
            }
            Ok(StoreConfig::Memory)
        }
        "redis" | "rediss" => {
            let (_, hosts, _) = split_authority(rest);
            if hosts.is_empty() || hosts.contains(',') {
                return Err(Located::at(
                    value,
                    format!(
                        "invalid store `{shown}`; a {scheme}:// URL names one server, e.g. `{scheme}://127.0.0.1:6379/0`; for several, use redis+sentinel:// or redis+cluster://"
                    ),
                ));
            }
            Ok(StoreConfig::Redis {
                url: url.to_owned(),
            })
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
            let options = sentinel_options(value, query)?;
            let (userinfo, hosts, path) = split_authority(rest);
            let mut parts = path.unwrap_or("").split('/');
            let master = parts.next().unwrap_or("").to_owned();
            if master.is_empty() {
                return Err(Located::at(
                    value,
                    format!(
                        "store `{shown}` names no master; append the master name, e.g. `redis+sentinel://{hosts}/mymaster`"
                    ),
                ));
            }
            let db = match parts.next() {
                None | Some("") => 0,
                Some(db) => db.parse().map_err(|_| Located::at(value, format!("invalid database `{db}` in store URL; write a number, e.g. `/mymaster/0`")))?,
            };
            Ok(StoreConfig::Sentinel {
                sentinels: parse_hosts(value, hosts, 26379)?,
                master,
                tls: scheme.starts_with("rediss"),
                auth: parse_auth(userinfo),
                db,
                sentinel_auth: options.auth,
                sentinel_tls: options.tls,
            })
        }
        "redis+cluster" | "rediss+cluster" => {
            let (userinfo, hosts, _) = split_authority(rest);
            Ok(StoreConfig::Cluster {
                nodes: parse_hosts(value, hosts, 6379)?,
                tls: scheme.starts_with("rediss"),
                auth: parse_auth(userinfo),
            })
        }
        other => Err(Located::at(
            value,
            format!(
                "unknown store scheme `{other}://`; {}",
                suggestion(other, &schemes)
            ),
        )),
    }
}

fn non_empty(field: &str, value: &Spanned<String>) -> Result<String, Located> {
    if value.value.trim().is_empty() {
        return Err(Located::at(value, format!("`{field}` is empty")));
    }
    Ok(value.value.clone())
}

fn mask_len(
    value: Option<&Spanned<i64>>,
    default: u8,
    max: u8,
    family: &str,
) -> Result<u8, Located> {
    match value {
        None => Ok(default),
        Some(v) if (0..=i64::from(max)).contains(&v.value) => Ok(v.value as u8),
        Some(v) => Err(Located::at(
            v,
            format!(
                "{family} prefix length must be between 0 and {max}, found {}",
                v.value
            ),
        )),
    }
}

fn action(raw: &Spanned<RawAction>) -> Result<Action, Located> {
    Ok(match &raw.value {
        RawAction::RequestHeaders {
            header_name,
            descriptor_key,
            skip_if_absent,
        } => Action::RequestHeaders {
            header_name: non_empty("header_name", header_name)?.to_ascii_lowercase(),
            descriptor_key: non_empty("descriptor_key", descriptor_key)?,
            skip_if_absent: *skip_if_absent,
        },
        RawAction::RemoteAddress {} => Action::RemoteAddress,
        RawAction::MaskedRemoteAddress {
            v4_prefix_mask_len,
            v6_prefix_mask_len,
        } => Action::MaskedRemoteAddress {
            v4_prefix_len: mask_len(v4_prefix_mask_len.as_ref(), 32, 32, "IPv4")?,
            v6_prefix_len: mask_len(v6_prefix_mask_len.as_ref(), 128, 128, "IPv6")?,
        },
        RawAction::GenericKey {
            descriptor_value,
            descriptor_key,
        } => Action::GenericKey {
            descriptor_key: descriptor_key
                .as_ref()
                .map(|k| non_empty("descriptor_key", k))
                .transpose()?
                .unwrap_or_else(|| "generic_key".to_owned()),
            descriptor_value: non_empty("descriptor_value", descriptor_value)?,
        },
        RawAction::HeaderValueMatch {
            descriptor_value,
            descriptor_key,
            expect_match,
            headers,
        } => {
            if headers.is_empty() {
                return Err(Located::at(
                    raw,
                    "header_value_match needs at least one entry in `headers`",
                ));
            }
            let headers = headers
                .iter()
                .map(|h| {
                    let conditions = [
                        h.exact_match.clone().map(HeaderMatch::Exact),
                        h.prefix_match.clone().map(HeaderMatch::Prefix),
                        h.suffix_match.clone().map(HeaderMatch::Suffix),
                        h.contains_match.clone().map(HeaderMatch::Contains),
                        h.present_match.map(HeaderMatch::Present),
                    ];
                    let mut set = conditions.into_iter().flatten();
                    let matcher = set.next().ok_or_else(|| Located::at(&h.name, "a header matcher needs one of `exact_match`, `prefix_match`, `suffix_match`, `contains_match`, `present_match`"))?;
                    if set.next().is_some() {
                        return Err(Located::at(&h.name, "a header matcher takes only one of `exact_match`, `prefix_match`, `suffix_match`, `contains_match`, `present_match`; split it into two matchers"));
                    }
                    Ok(HeaderMatcher { name: non_empty("name", &h.name)?.to_ascii_lowercase(), matcher, invert: h.invert_match })
                })
                .collect::<Result<_, _>>()?;
            Action::HeaderValueMatch {
                descriptor_key: descriptor_key
                    .as_ref()
                    .map(|k| non_empty("descriptor_key", k))
                    .transpose()?
                    .unwrap_or_else(|| "header_match".to_owned()),
                descriptor_value: non_empty("descriptor_value", descriptor_value)?,
                expect_match: *expect_match,
                headers,
            }
        }
        RawAction::QueryParameter {
            query_parameter_name,
            descriptor_key,
            skip_if_absent,
        } => Action::QueryParameter {
            name: non_empty("query_parameter_name", query_parameter_name)?,
            descriptor_key: non_empty("descriptor_key", descriptor_key)?,
            skip_if_absent: *skip_if_absent,
        },
        RawAction::Method { descriptor_key } => Action::Method {
            descriptor_key: descriptor_key
                .as_ref()
                .map(|k| non_empty("descriptor_key", k))
                .transpose()?
                .unwrap_or_else(|| "method".to_owned()),
        },
        RawAction::Path { descriptor_key } => Action::Path {
            descriptor_key: descriptor_key
                .as_ref()
                .map(|k| non_empty("descriptor_key", k))
                .transpose()?
                .unwrap_or_else(|| "path".to_owned()),
        },
    })
}

fn route(raw: &RawRoute) -> Result<Route, Located> {
    let m = &raw.matcher.value;
    let paths = [&m.path_prefix, &m.path, &m.path_template]
        .iter()
        .filter(|p| p.is_some())
        .count();
    if paths > 1 {
        return Err(Located::at(
            &raw.matcher,
            "a route matches on one of `path_prefix`, `path` or `path_template`, not several",
        ));
    }
    for p in [&m.path_prefix, &m.path, &m.path_template]
        .into_iter()
        .flatten()
    {
        if !p.value.starts_with('/') {
            return Err(Located::at(
                p,
                format!("path `{}` must start with `/`", p.value),
            ));
        }
    }
    if let Some(t) = &m.path_template {
        let open = t.value.matches('{').count();
        if open != t.value.matches('}').count() || t.value.contains("{}") {
            return Err(Located::at(
                t,
                format!(
                    "invalid path template `{}`; name each segment, e.g. `/users/{{id}}`",
                    t.value
                ),
            ));
        }
    }
    let method = m
        .method
        .as_ref()
        .map(|meth| {
            let upper = meth.value.to_ascii_uppercase();
            const METHODS: [&str; 9] = [
                "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
            ];
            if METHODS.contains(&upper.as_str()) {
                Ok(upper)
            } else {
                Err(Located::at(
                    meth,
                    format!(
                        "unknown HTTP method `{}`; {}",
                        meth.value,
                        suggestion(&upper, &METHODS)
                    ),
                ))
            }
        })
        .transpose()?;
    let cost = match &raw.cost {
        None => 1,
        Some(c) if (1..=MAX_COST).contains(&c.value) => c.value as u64,
        Some(c) => {
            return Err(Located::at(
                c,
                format!(
                    "cost must be between 1 and {MAX_COST}, found {}; a free route simply has no `rate_limits`",
                    c.value
                ),
            ));
        }
    };
    let rate_limits = raw
        .rate_limits
        .iter()
        .map(|entry| {
            if entry.actions.value.is_empty() {
                return Err(Located::at(
                    &entry.actions,
                    "`actions` is empty; list at least one action",
                ));
            }
            entry.actions.value.iter().map(action).collect()
        })
        .collect::<Result<_, _>>()?;
    Ok(Route {
        matcher: RouteMatch {
            path_prefix: m.path_prefix.as_ref().map(|p| p.value.clone()),
            path: m.path.as_ref().map(|p| p.value.clone()),
            path_template: m.path_template.as_ref().map(|p| p.value.clone()),
            method,
        },
        cost,
        rate_limits,
    })
}

fn gateway(raw: &RawGateway, headers: HeaderStyle) -> Result<Gateway, Located> {
    let upstream = raw.upstream.value.trim_end_matches('/');
    let Some(authority) = upstream.strip_prefix("http://") else {
        return Err(Located::at(
            &raw.upstream,
            format!(
                "invalid upstream `{}`; write `http://host:port` (TLS to the upstream is not supported yet)",
                raw.upstream.value
            ),
        ));
    };
    if authority.is_empty() || authority.contains('/') {
        return Err(Located::at(
            &raw.upstream,
            format!(
                "invalid upstream `{}`; write `http://host:port` with no path",
                raw.upstream.value
            ),
        ));
    }
    Ok(Gateway {
        listen: parse_addr("listen", &raw.listen)?,
        upstream: upstream.to_owned(),
        domain: non_empty("domain", &raw.domain)?,
        headers: raw
            .headers
            .as_ref()
            .map(parse_headers)
            .transpose()?
            .unwrap_or(headers),
        routes: raw.routes.iter().map(route).collect::<Result<_, _>>()?,
        upstream_timeout: raw
            .upstream_timeout
            .as_ref()
            .map(|t| crate::rules::parse_positive_duration("upstream_timeout", t, false))
            .transpose()?
            .unwrap_or(std::time::Duration::from_secs(30)),
        workers: raw
            .workers
            .as_ref()
            .map(|n| {
                usize::try_from(n.value)
                    .ok()
                    .filter(|w| (1..=1024).contains(w))
                    .and_then(std::num::NonZeroUsize::new)
                    .ok_or_else(|| {
                        Located::at(
                            n,
                            format!(
                                "workers must be between 1 and 1024, found {}; leave it out for one per CPU",
                                n.value
                            ),
                        )
                    })
            })
            .transpose()?,
    })
}

impl ServiceConfig {
    /// Validates a parsed `sluice.yaml` and loads the rule files it names.
    pub(crate) fn from_raw(raw: RawServiceFile, file: &Path) -> Result<Self, ConfigError> {
        let err = |e: Located| e.in_file(file);
        let store = raw
            .store
            .as_ref()
            .map(parse_store)
            .transpose()
            .map_err(err)?
            .unwrap_or(StoreConfig::Memory);
        let defaults_listen = Listen::default();
        let listen = Listen {
            http: raw
                .listen
                .http
                .as_ref()
                .map(|a| parse_addr("listen.http", a))
                .transpose()
                .map_err(err)?
                .unwrap_or(defaults_listen.http),
            grpc: raw
                .listen
                .grpc
                .as_ref()
                .map(|a| parse_addr("listen.grpc", a))
                .transpose()
                .map_err(err)?
                .unwrap_or(defaults_listen.grpc),
            admin: raw
                .listen
                .admin
                .as_ref()
                .map(|a| parse_addr("listen.admin", a))
                .transpose()
                .map_err(err)?
                .unwrap_or(defaults_listen.admin),
        };
        let d = &raw.defaults;
        let defaults = parse_settings(
            d.algorithm.as_ref(),
            d.mode.as_ref(),
            d.spans.as_ref(),
            d.cooldown.as_ref(),
            d.on_store_error.as_ref(),
            d.policy.as_ref(),
        )
        .map_err(err)?;
        let headers = raw
            .headers
            .as_ref()
            .map(parse_headers)
            .transpose()
            .map_err(err)?
            .unwrap_or(HeaderStyle::Ietf);
        let gateways: Vec<Gateway> = raw
            .gateways
            .iter()
            .map(|g| gateway(g, headers))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let base = file.parent().unwrap_or(Path::new("."));
        let rule_entries = raw.rules.clone().unwrap_or_default();
        let rule_paths: Vec<PathBuf> = rule_entries.iter().map(|p| base.join(&p.value)).collect();
        let mut domains = Vec::new();
        for (entry, path) in rule_entries.iter().zip(&rule_paths) {
            let files = crate::load::rule_files(path).map_err(|e| {
                Located::at(
                    entry,
                    format!(
                        "cannot read rules `{}`: {e}; check the path (it is relative to this file)",
                        entry.value
                    ),
                )
                .in_file(file)
            })?;
            for f in files {
                domains.push(crate::load::load_domain_file(&f)?);
            }
        }
        let rules = RuleSet::new(domains)?;
        for domain in rules.domains() {
            for rule in domain.rules() {
                if let crate::rules::Limit::Limited(spec) = &rule.limit {
                    let merged = RuleSettings {
                        spans: spec.settings.spans.or(defaults.spans),
                        cooldown: spec.settings.cooldown.or(defaults.cooldown),
                        ..Default::default()
                    };
                    let position = rule.position;
                    crate::rules::check_settings_fit(spec.rate, &merged, &|_| position).map_err(
                        |mut e| {
                            e.message =
                                format!("{} (with the defaults of {})", e.message, file.display());
                            e.in_file(domain.file())
                        },
                    )?;
                }
            }
        }
        let api_domain = match &raw.api.domain {
            Some(d) => {
                let name = non_empty("api.domain", d).map_err(err)?;
                if raw.rules.is_some() && rules.domain(&name).is_none() {
                    return Err(err(unknown_domain(d, &rules)));
                }
                name
            }
            None => "default".to_owned(),
        };
        if raw.rules.is_some() {
            for (g, raw_g) in gateways.iter().zip(&raw.gateways) {
                if rules.domain(&g.domain).is_none() {
                    return Err(err(unknown_domain(&raw_g.domain, &rules)));
                }
            }
        }
        let expected_instances = match &raw.expected_instances {
            None => 1,
            Some(n) if (1..=100_000).contains(&n.value) => n.value as u64,
            Some(n) => {
                return Err(err(Located::at(
                    n,
                    format!(
                        "expected_instances must be between 1 and 100000, found {}; write the most instances the deployment runs",
                        n.value
                    ),
                )));
            }
        };
        let max_keys_per_rule = match &raw.max_keys_per_rule {
            None => DEFAULT_MAX_KEYS_PER_RULE,
            Some(n) if (1..=100_000_000).contains(&n.value) => n.value as usize,
            Some(n) => {
                return Err(err(Located::at(
                    n,
                    format!(
                        "max_keys_per_rule must be between 1 and 100000000, found {}; each tracked key takes about 200 bytes (docs/RELIABILITY.md)",
                        n.value
                    ),
                )));
            }
        };
        Ok(ServiceConfig {
            file: file.to_path_buf(),
            store,
            listen,
            rule_paths,
            rules,
            defaults,
            api_domain,
            headers,
            gateways,
            expected_instances,
            max_keys_per_rule,
            store_ca_file: raw.store_ca_file.as_ref().map(|f| base.join(&f.value)),
            listeners: crate::protection::parse_listeners(&raw.listeners).map_err(err)?,
            access: crate::protection::parse_access(&raw.access, base).map_err(err)?,
        })
    }
}

fn unknown_domain(name: &Spanned<String>, rules: &RuleSet) -> Located {
    let known: Vec<&str> = rules.domains().map(|d| d.name()).collect();
    let hint = if known.is_empty() {
        "no rule file defines a domain".to_owned()
    } else {
        suggestion(&name.value, &known)
    };
    Located::at(
        name,
        format!(
            "domain `{}` is not defined by any rule file; {hint}",
            name.value
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::StoreConfig;

    fn store(url: &str) -> Result<StoreConfig, String> {
        crate::parse_service(std::path::Path::new("t.yaml"), &format!("store: {url}\n"))
            .map(|c| c.store)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn sentinel_urls_carry_logins_for_the_data_nodes_and_the_sentinels() {
        let StoreConfig::Sentinel {
            sentinels,
            master,
            auth,
            db,
            tls,
            sentinel_auth,
            sentinel_tls,
        } = store("rediss+sentinel://app:p%40ss@s1,s2:26380/mymaster/2?sentinel_username=watch&sentinel_password=s%2Fcret&sentinel_tls=true")
            .unwrap()
        else {
            panic!("not a sentinel store");
        };
        assert_eq!(sentinels, ["s1:26379", "s2:26380"]);
        assert_eq!(
            (master.as_str(), db, tls, sentinel_tls),
            ("mymaster", 2, true, true)
        );
        assert_eq!(auth, Some((Some("app".into()), "p@ss".into())));
        assert_eq!(sentinel_auth, Some((Some("watch".into()), "s/cret".into())));

        let StoreConfig::Sentinel {
            sentinel_auth,
            sentinel_tls,
            ..
        } = store("redis+sentinel://s1/m?sentinel_password=x").unwrap()
        else {
            panic!("not a sentinel store");
        };
        assert_eq!(
            (sentinel_auth, sentinel_tls),
            (Some((None, "x".into())), false)
        );
    }

    #[test]
    fn bad_sentinel_url_options_are_named() {
        let e = store("redis+sentinel://s1/m?sentinel_pasword=x").unwrap_err();
        assert!(
            e.contains("unknown store URL option `sentinel_pasword`")
                && e.contains("`sentinel_password`"),
            "{e}"
        );
        let e = store("redis+sentinel://s1/m?sentinel_tls=maybe").unwrap_err();
        assert!(e.contains("invalid sentinel_tls `maybe`"), "{e}");
        let e = store("redis+sentinel://s1/m?sentinel_username=u").unwrap_err();
        assert!(e.contains("without `sentinel_password`"), "{e}");
    }
}
