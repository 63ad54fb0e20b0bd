//! `gateways:` in `sluice.yaml`: reverse-proxy gateways, their routes and descriptor actions,
//! validated.

use std::net::SocketAddr;

use serde_saphyr::Spanned;

use crate::error::{Located, suggestion};
use crate::fields::{HeaderStyle, MAX_COST, non_empty, parse_addr, parse_headers};
use crate::raw::{RawAction, RawGateway, RawRoute, RawRouteMatch};

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

/// How loosely a request path is compared with the routes. Every field defaults to `false`,
/// the secure side: the spellings that common upstreams (Express, Rails, Spring, Tomcat, IIS)
/// serve as one resource match one route. Each field, set, keeps a distinction for upstreams
/// that really serve the two spellings as different resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathMatching {
    /// `case_sensitive_paths`: `/LOGIN` no longer matches a `/login` route.
    pub case_sensitive: bool,
    /// `strict_trailing_slash`: `/login/` no longer matches a `/login` route.
    pub strict_trailing_slash: bool,
    /// `strict_path_parameters`: `/login;jsessionid=1` no longer matches a `/login` route
    /// (the `;` part of each segment is otherwise ignored when routes match).
    pub strict_path_parameters: bool,
    /// `strict_head`: a `HEAD` request no longer matches a route that says `method: GET`.
    pub strict_head: bool,
    /// `strict_query_separators`: `;` is data in a query, not a separator as it is to Rack 2,
    /// Go before 1.17 and Python before 3.9.2.
    pub strict_query_separators: bool,
    /// `strict_query_names`: `USER` is not the `user` query parameter (ASP.NET Core reads it
    /// as `user`).
    pub strict_query_names: bool,
    /// `ignore_method_override`: a request that names another method (`X-HTTP-Method-Override`,
    /// `X-HTTP-Method`, `X-Method-Override`, `?_method=`) is no longer refused.
    pub ignore_method_override: bool,
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
    /// What `geoip`'s databases say of the client address: its country (ISO 3166 code, e.g.
    /// `DE`) or its autonomous system number (e.g. `13335`). An address no database knows
    /// gives `default_value`; no client address skips the descriptor, as `remote_address`.
    Geo {
        /// Which field.
        field: GeoField,
        /// Descriptor key (default `country` or `asn`).
        descriptor_key: String,
        /// The value for an address the databases do not know (default `unknown`).
        default_value: String,
    },
}

/// What the `country` and `asn` actions look up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeoField {
    /// The country's ISO 3166-1 alpha-2 code.
    Country,
    /// The autonomous system number, in decimal.
    Asn,
}

/// The most `X-Forwarded-For` hops a gateway may trust (`trusted_hops`).
pub const MAX_TRUSTED_HOPS: usize = 16;

impl Action {
    /// The key of the descriptor entry it builds.
    pub fn descriptor_key(&self) -> &str {
        match self {
            Self::RequestHeaders { descriptor_key, .. }
            | Self::GenericKey { descriptor_key, .. }
            | Self::HeaderValueMatch { descriptor_key, .. }
            | Self::QueryParameter { descriptor_key, .. }
            | Self::Method { descriptor_key }
            | Self::Path { descriptor_key }
            | Self::Geo { descriptor_key, .. } => descriptor_key,
            Self::RemoteAddress => "remote_address",
            Self::MaskedRemoteAddress { .. } => "masked_remote_address",
        }
    }

    /// Whether a request without its input skips only this entry (`skip_if_absent`).
    pub fn skippable(&self) -> bool {
        matches!(
            self,
            Self::RequestHeaders {
                skip_if_absent: true,
                ..
            } | Self::QueryParameter {
                skip_if_absent: true,
                ..
            }
        )
    }
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
    /// Give a request's cost back when the gateway could not open a connection to the
    /// upstream, so the request was never sent (a 502 of the gateway's own):
    /// `refund_upstream_failures`, default `false` (a request let through is counted, whatever
    /// the upstream does). A timeout (504), a connection lost after the request was sent, or
    /// any answer of the upstream is never refunded: the upstream may have done the work.
    pub refund_upstream_failures: bool,
    /// How many `X-Forwarded-For` entries were added by trusted proxies in front of the
    /// gateway (`trusted_hops`, default 0: the peer is the client). The client address the
    /// address actions use is that many hops back.
    pub trusted_hops: usize,
    /// How request paths are compared with the routes (`case_sensitive_paths`,
    /// `strict_trailing_slash`, `strict_path_parameters`, `strict_head`, and how the query and
    /// method overrides are read: `strict_query_separators`, `strict_query_names`,
    /// `ignore_method_override`; all `false` by default).
    pub path_matching: PathMatching,
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

// Over 80 lines on purpose: one arm per kind of action, each checking its own fields; the
// arms share nothing to factor out and read best side by side.
pub(crate) fn action(raw: &Spanned<RawAction>) -> Result<Action, Located> {
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
        RawAction::Country {
            descriptor_key,
            default_value,
        } => geo(GeoField::Country, descriptor_key, default_value)?,
        RawAction::Asn {
            descriptor_key,
            default_value,
        } => geo(GeoField::Asn, descriptor_key, default_value)?,
    })
}

fn geo(
    field: GeoField,
    descriptor_key: &Option<Spanned<String>>,
    default_value: &Option<Spanned<String>>,
) -> Result<Action, Located> {
    let name = match field {
        GeoField::Country => "country",
        GeoField::Asn => "asn",
    };
    Ok(Action::Geo {
        field,
        descriptor_key: descriptor_key
            .as_ref()
            .map(|k| non_empty("descriptor_key", k))
            .transpose()?
            .unwrap_or_else(|| name.to_owned()),
        default_value: default_value
            .as_ref()
            .map(|v| non_empty("default_value", v))
            .transpose()?
            .unwrap_or_else(|| "unknown".to_owned()),
    })
}

/// Whether a gateway's routes use `country` or `asn` (they need `geoip:`): the first such
/// action, for the error.
pub(crate) fn first_geo_action(raw: &RawGateway) -> Option<&Spanned<RawAction>> {
    raw.routes
        .iter()
        .flat_map(|r| &r.rate_limits)
        .flat_map(|e| &e.actions.value)
        .find(|a| matches!(a.value, RawAction::Country { .. } | RawAction::Asn { .. }))
}

pub(crate) fn route(raw: &RawRoute) -> Result<Route, Located> {
    let m = &raw.matcher.value;
    check_paths(&raw.matcher)?;
    let method = route_method(m)?;
    let cost = route_cost(raw)?;
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

/// One path matcher at most, each starting with `/`, a template's segments named.
fn check_paths(matcher: &Spanned<RawRouteMatch>) -> Result<(), Located> {
    let m = &matcher.value;
    let paths = [&m.path_prefix, &m.path, &m.path_template]
        .iter()
        .filter(|p| p.is_some())
        .count();
    if paths > 1 {
        return Err(Located::at(
            matcher,
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
    Ok(())
}

/// The route's method in upper case, one of HTTP's nine.
fn route_method(m: &RawRouteMatch) -> Result<Option<String>, Located> {
    m.method
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
        .transpose()
}

/// The route's cost: 1 by default, at most `MAX_COST`.
fn route_cost(raw: &RawRoute) -> Result<u64, Located> {
    match &raw.cost {
        None => Ok(1),
        Some(c) if (1..=MAX_COST).contains(&c.value) => Ok(c.value as u64),
        Some(c) => Err(Located::at(
            c,
            format!(
                "cost must be between 1 and {MAX_COST}, found {}; a free route simply has no `rate_limits`",
                c.value
            ),
        )),
    }
}

pub(crate) fn gateway(raw: &RawGateway, headers: HeaderStyle) -> Result<Gateway, Located> {
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
        workers: raw.workers.as_ref().map(parse_workers).transpose()?,
        refund_upstream_failures: raw.refund_upstream_failures.unwrap_or(false),
        path_matching: PathMatching {
            case_sensitive: raw.case_sensitive_paths.unwrap_or(false),
            strict_trailing_slash: raw.strict_trailing_slash.unwrap_or(false),
            strict_path_parameters: raw.strict_path_parameters.unwrap_or(false),
            strict_head: raw.strict_head.unwrap_or(false),
            strict_query_separators: raw.strict_query_separators.unwrap_or(false),
            strict_query_names: raw.strict_query_names.unwrap_or(false),
            ignore_method_override: raw.ignore_method_override.unwrap_or(false),
        },
        trusted_hops: match &raw.trusted_hops {
            None => 0,
            Some(n) => usize::try_from(n.value)
                .ok()
                .filter(|&h| h <= MAX_TRUSTED_HOPS)
                .ok_or_else(|| {
                    Located::at(
                        n,
                        format!(
                            "trusted_hops must be between 0 and {MAX_TRUSTED_HOPS}, found {}; count the proxies in front of the gateway that append to X-Forwarded-For",
                            n.value
                        ),
                    )
                })?,
        },
    })
}

/// A `workers:` count (a gateway's, `api.workers`): 1 to 1024.
pub(crate) fn parse_workers(n: &Spanned<i64>) -> Result<std::num::NonZeroUsize, Located> {
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
}
