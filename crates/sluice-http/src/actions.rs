//! Envoy-style rate-limit actions: build descriptors from a request.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::{HeaderMap, Method};
use sluice_config::{Action, GeoField, HeaderMatch, HeaderMatcher, Route};

use crate::client_ip::canonical_ip;
use crate::query::{QueryReading, query_params};
use crate::value::{descriptor_value, query_value};

/// What the actions read from a request.
#[derive(Clone, Copy, Debug)]
pub struct RequestParts<'a> {
    /// Method.
    pub method: &'a Method,
    /// The path as routes see it: normalized (see [`crate::normalize_path`]), then in its
    /// canonical spelling ([`crate::RoutePath::canonical`]); the `path` action's value on a
    /// route without a template.
    pub path: &'a str,
    /// Query string, without `?`.
    pub query: Option<&'a str>,
    /// Headers.
    pub headers: &'a HeaderMap,
    /// The client address, after trusted `X-Forwarded-For` hops ([`crate::client_address`];
    /// an IPv4-mapped address is read as IPv4 whoever built these parts).
    pub client: Option<IpAddr>,
    /// Whether `HEAD` counts as `GET` (the `method` action's value; not with `strict_head`).
    pub head_as_get: bool,
    /// How the `query_parameter` action finds its parameter (`;` as a separator, names in
    /// any case, unless its settings say otherwise).
    pub query_reading: QueryReading,
    /// The databases the `country` and `asn` actions read (none: those actions skip their
    /// descriptor).
    pub geo: Option<&'a crate::GeoIp>,
}

/// One descriptor: key/value entries, borrowed from the route and the request where possible
/// (no allocation for header values, constants or the method).
pub type Descriptor<'a> = Vec<(&'a str, Cow<'a, str>)>;

fn mask(ip: IpAddr, v4: u8, v6: u8) -> String {
    match canonical_ip(ip) {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = if v4 == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(v4.min(32)))
            };
            format!("{}/{v4}", Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = if v6 == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(v6.min(128)))
            };
            format!("{}/{v6}", Ipv6Addr::from(bits & m))
        }
    }
}

fn header_holds(headers: &HeaderMap, matcher: &HeaderMatcher) -> bool {
    let value = headers
        .get(matcher.name.as_str())
        .map(|v| descriptor_value(v.as_bytes()));
    let value = value.as_deref();
    let holds = match (&matcher.matcher, value) {
        (HeaderMatch::Present(want), v) => v.is_some() == *want,
        (_, None) => false,
        (HeaderMatch::Exact(x), Some(v)) => v == x,
        (HeaderMatch::Prefix(x), Some(v)) => v.starts_with(x.as_str()),
        (HeaderMatch::Suffix(x), Some(v)) => v.ends_with(x.as_str()),
        (HeaderMatch::Contains(x), Some(v)) => v.contains(x.as_str()),
        (_, Some(_)) => false,
    };
    holds != matcher.invert
}

/// Builds the descriptors of `route` for a request, with Envoy's rule: when an action cannot
/// produce its entry (a missing header, no client address), that whole descriptor is skipped,
/// unless the action says `skip_if_absent`, which skips only its entry.
// Over 80 lines on purpose: one arm per kind of action, each reading its input from the
// request; Envoy's skip rule around them is easier to check with every arm in view.
pub fn descriptors<'a>(route: &'a Route, req: &RequestParts<'a>) -> Vec<Descriptor<'a>> {
    let template = route.matcher.path_template.as_deref();
    route
        .rate_limits
        .iter()
        .filter_map(|actions| {
            let mut entries: Descriptor<'a> = Vec::with_capacity(actions.len());
            for action in actions {
                match action {
                    Action::RequestHeaders {
                        header_name,
                        descriptor_key,
                        skip_if_absent,
                    } => match req.headers.get(header_name.as_str()) {
                        Some(v) => {
                            entries.push((descriptor_key.as_str(), descriptor_value(v.as_bytes())))
                        }
                        None if *skip_if_absent => {}
                        None => return None,
                    },
                    Action::RemoteAddress => entries.push((
                        "remote_address",
                        Cow::Owned(canonical_ip(req.client?).to_string()),
                    )),
                    Action::MaskedRemoteAddress {
                        v4_prefix_len,
                        v6_prefix_len,
                    } => {
                        entries.push((
                            "masked_remote_address",
                            Cow::Owned(mask(req.client?, *v4_prefix_len, *v6_prefix_len)),
                        ));
                    }
                    Action::GenericKey {
                        descriptor_key,
                        descriptor_value,
                    } => {
                        entries.push((
                            descriptor_key.as_str(),
                            Cow::Borrowed(descriptor_value.as_str()),
                        ));
                    }
                    Action::HeaderValueMatch {
                        descriptor_key,
                        descriptor_value,
                        expect_match,
                        headers,
                    } => {
                        let all = headers.iter().all(|m| header_holds(req.headers, m));
                        if all != *expect_match {
                            return None;
                        }
                        entries.push((
                            descriptor_key.as_str(),
                            Cow::Borrowed(descriptor_value.as_str()),
                        ));
                    }
                    Action::QueryParameter {
                        name,
                        descriptor_key,
                        skip_if_absent,
                    } => match query_params(req.query, name, req.query_reading).next() {
                        Some(found) => {
                            entries.push((descriptor_key.as_str(), query_value(found.value)))
                        }
                        None if *skip_if_absent => {}
                        None => return None,
                    },
                    Action::Method { descriptor_key } => {
                        let method = if req.head_as_get && *req.method == Method::HEAD {
                            Method::GET.as_str()
                        } else {
                            req.method.as_str()
                        };
                        entries.push((descriptor_key.as_str(), Cow::Borrowed(method)))
                    }
                    Action::Path { descriptor_key } => {
                        entries.push((
                            descriptor_key.as_str(),
                            Cow::Borrowed(template.unwrap_or(req.path)),
                        ));
                    }
                    Action::Geo {
                        field,
                        descriptor_key,
                        default_value,
                    } => {
                        let (ip, geo) = (canonical_ip(req.client?), req.geo?);
                        let found = match field {
                            GeoField::Country => geo.country(ip),
                            GeoField::Asn => geo.asn(ip).map(|n| n.to_string()),
                        };
                        let value = found.map_or(Cow::Borrowed(default_value.as_str()), Cow::Owned);
                        entries.push((descriptor_key.as_str(), value));
                    }
                    _ => return None,
                }
            }
            (!entries.is_empty()).then_some(entries)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_addresses() {
        assert_eq!(
            mask("192.168.17.5".parse().unwrap(), 24, 64),
            "192.168.17.0/24"
        );
        assert_eq!(
            mask("2001:db8:1:2:3:4:5:6".parse().unwrap(), 32, 64),
            "2001:db8:1:2::/64"
        );
        assert_eq!(mask("10.1.2.3".parse().unwrap(), 0, 0), "0.0.0.0/0");
        assert_eq!(
            mask("::ffff:192.168.17.5".parse().unwrap(), 24, 64),
            "192.168.17.0/24",
            "an IPv4-mapped address is IPv4"
        );
    }
}
