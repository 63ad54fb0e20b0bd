//! Envoy-style rate-limit actions: build descriptors from a request.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::{HeaderMap, Method};
use sluice_config::{Action, GeoField, HeaderMatch, HeaderMatcher, Route, RouteMatch};

use crate::value::{descriptor_value, query_value};

/// What the actions read from a request.
#[derive(Clone, Copy, Debug)]
pub struct RequestParts<'a> {
    /// Method.
    pub method: &'a Method,
    /// Path, without the query, normalized (see [`crate::normalize_path`]).
    pub path: &'a str,
    /// Query string, without `?`.
    pub query: Option<&'a str>,
    /// Headers.
    pub headers: &'a HeaderMap,
    /// The client address, after trusted `X-Forwarded-For` hops.
    pub client: Option<IpAddr>,
    /// The databases the `country` and `asn` actions read (none: those actions skip their
    /// descriptor).
    pub geo: Option<&'a crate::GeoIp>,
}

/// One descriptor: key/value entries, borrowed from the route and the request where possible
/// (no allocation for header values, constants or the method).
pub type Descriptor<'a> = Vec<(&'a str, Cow<'a, str>)>;

/// Whether `route` takes the request, and the path template it matched, if any.
pub fn route_matches(m: &RouteMatch, method: &Method, path: &str) -> bool {
    if let Some(want) = &m.method
        && want != method.as_str()
    {
        return false;
    }
    if let Some(p) = &m.path {
        return path == p;
    }
    if let Some(prefix) = &m.path_prefix {
        return path.starts_with(prefix.as_str());
    }
    if let Some(template) = &m.path_template {
        return template_matches(template, path);
    }
    true
}

/// `/users/{id}` matches `/users/42`, not `/users/42/x` nor `/users/`.
fn template_matches(template: &str, path: &str) -> bool {
    let mut t = template.split('/');
    let mut p = path.split('/');
    loop {
        match (t.next(), p.next()) {
            (None, None) => return true,
            (Some(ts), Some(ps)) => {
                let is_param = ts.starts_with('{') && ts.ends_with('}');
                if (is_param && ps.is_empty()) || (!is_param && ts != ps) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

fn mask(ip: IpAddr, v4: u8, v6: u8) -> String {
    match ip {
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

fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name || (k.contains(['%', '+']) && query_value(k) == name)).then_some(v)
    })
}

/// Builds the descriptors of `route` for a request, with Envoy's rule: when an action cannot
/// produce its entry (a missing header, no client address), that whole descriptor is skipped,
/// unless the action says `skip_if_absent`, which skips only its entry.
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
                    Action::RemoteAddress => {
                        entries.push(("remote_address", Cow::Owned(req.client?.to_string())))
                    }
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
                    } => match query_param(req.query, name) {
                        Some(v) => entries.push((descriptor_key.as_str(), query_value(v))),
                        None if *skip_if_absent => {}
                        None => return None,
                    },
                    Action::Method { descriptor_key } => {
                        entries.push((descriptor_key.as_str(), Cow::Borrowed(req.method.as_str())))
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
                        let (ip, geo) = (req.client?, req.geo?);
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

/// The client address: the peer, or with `trusted_hops` > 0 the address that many hops back
/// in `X-Forwarded-For` (the right-most entries were added by our own trusted proxies). A
/// malformed or too short header falls back to the peer.
pub fn client_address(
    headers: &HeaderMap,
    peer: Option<IpAddr>,
    trusted_hops: usize,
) -> Option<IpAddr> {
    if trusted_hops == 0 {
        return peer;
    }
    let xff: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    xff.len()
        .checked_sub(trusted_hops)
        .and_then(|i| xff.get(i))
        .and_then(|s| s.parse().ok())
        .or(peer)
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
    }

    #[test]
    fn templates_match_whole_segments() {
        assert!(template_matches("/users/{id}", "/users/42"));
        assert!(!template_matches("/users/{id}", "/users/"));
        assert!(!template_matches("/users/{id}", "/users/42/posts"));
        assert!(template_matches("/users/{id}/posts", "/users/7/posts"));
    }

    #[test]
    fn forwarded_for_hops() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9, 10.0.0.2".parse().unwrap());
        let peer = Some("10.0.0.3".parse().unwrap());
        assert_eq!(client_address(&h, peer, 0), peer);
        assert_eq!(
            client_address(&h, peer, 1),
            Some("10.0.0.2".parse().unwrap())
        );
        assert_eq!(
            client_address(&h, peer, 2),
            Some("203.0.113.9".parse().unwrap())
        );
        assert_eq!(client_address(&h, peer, 5), peer, "too few hops: the peer");
        h.insert("x-forwarded-for", "not an address".parse().unwrap());
        assert_eq!(client_address(&h, peer, 1), peer, "malformed: the peer");
    }
}
