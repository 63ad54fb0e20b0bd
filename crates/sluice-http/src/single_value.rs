//! Each input a route's descriptors read must come once. With two `x-user-id` headers (or two
//! `key` query parameters) the limiter would count one copy while the upstream may read the
//! other (Rails and Django read the last query parameter, Spring the first; a proxy may join
//! headers), so a client could count against a fresh value every time and be served as
//! itself. Combining the copies into one value has the same hole (each combination is a
//! fresh value), so such a request is refused (400) and the upstream never sees a value that
//! was not the counted one.
//!
//! Rack, Django and every CGI-style server read `x_user_id` as `x-user-id` (both become
//! `HTTP_X_USER_ID`): a header that is another spelling of a header a descriptor reads is
//! refused the same way.

use http::HeaderMap;
use sluice_config::{Action, Route};

use crate::actions::query_params;

/// Why a request's descriptor inputs are ambiguous.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AmbiguousInput {
    /// A header a descriptor reads comes more than once.
    #[error("the header `{name}` is sent more than once; a rate limit reads it, send it once")]
    RepeatedHeader {
        /// The header's name.
        name: String,
    },
    /// A header whose name is another spelling (`_` for `-`) of one a descriptor reads.
    #[error(
        "the header `{sent}` is read as `{name}` by some servers; a rate limit reads `{name}`, send only that"
    )]
    HeaderAlias {
        /// The name as sent (at most 64 bytes of it).
        sent: String,
        /// The name the route reads.
        name: String,
    },
    /// A query parameter a descriptor reads comes more than once.
    #[error(
        "the query parameter `{name}` is sent more than once; a rate limit reads it, send it once"
    )]
    RepeatedQueryParameter {
        /// The parameter's name.
        name: String,
    },
}

fn header_names(route: &Route) -> impl Iterator<Item = &str> {
    route.rate_limits.iter().flatten().flat_map(|action| {
        let (one, many) = match action {
            Action::RequestHeaders { header_name, .. } => (Some(header_name.as_str()), None),
            Action::HeaderValueMatch { headers, .. } => (None, Some(headers)),
            _ => (None, None),
        };
        one.into_iter()
            .chain(many.into_iter().flatten().map(|m| m.name.as_str()))
    })
}

/// Checks that every header and query parameter `route`'s actions read comes at most once,
/// and that no header is an underscore spelling of one of them.
///
/// # Errors
/// The first input that is not single, as [`AmbiguousInput`].
pub fn check_single_inputs(
    route: &Route,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<(), AmbiguousInput> {
    for name in header_names(route) {
        if headers.get_all(name).iter().nth(1).is_some() {
            return Err(AmbiguousInput::RepeatedHeader {
                name: name.to_owned(),
            });
        }
    }
    for sent in headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.contains('_'))
    {
        let alias = |name: &str| {
            name.len() == sent.len()
                && name
                    .bytes()
                    .zip(sent.bytes())
                    .all(|(a, b)| a == b || (a == b'-' && b == b'_'))
        };
        if let Some(name) = header_names(route).find(|n| alias(n)) {
            return Err(AmbiguousInput::HeaderAlias {
                sent: sent.chars().take(64).collect(),
                name: name.to_owned(),
            });
        }
    }
    for action in route.rate_limits.iter().flatten() {
        if let Action::QueryParameter { name, .. } = action
            && query_params(query, name).nth(1).is_some()
        {
            return Err(AmbiguousInput::RepeatedQueryParameter { name: name.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(yaml_actions: &str) -> Route {
        let yaml = format!(
            "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:2\n    domain: d\n    routes:\n      - match: {{ path_prefix: / }}\n        rate_limits:\n          - actions:\n{yaml_actions}"
        );
        sluice_config::parse_service(std::path::Path::new("t.yaml"), &yaml)
            .unwrap()
            .gateways
            .remove(0)
            .routes
            .remove(0)
    }

    #[test]
    fn repeated_or_aliased_headers_are_refused() {
        let r = route(
            "              - request_headers: { header_name: X-User-Id, descriptor_key: user }\n",
        );
        let mut h = HeaderMap::new();
        h.append("x-user-id", "a".parse().unwrap());
        assert_eq!(check_single_inputs(&r, &h, None), Ok(()));
        h.append("x-user-id", "b".parse().unwrap());
        assert!(matches!(
            check_single_inputs(&r, &h, None),
            Err(AmbiguousInput::RepeatedHeader { .. })
        ));
        let mut h = HeaderMap::new();
        h.append("x-user-id", "a".parse().unwrap());
        h.append("x_user-id", "b".parse().unwrap());
        assert!(matches!(
            check_single_inputs(&r, &h, None),
            Err(AmbiguousInput::HeaderAlias { .. })
        ));
        let mut h = HeaderMap::new();
        h.append("x_other", "b".parse().unwrap());
        assert_eq!(check_single_inputs(&r, &h, None), Ok(()), "unrelated");
    }

    #[test]
    fn header_matchers_and_query_parameters_too() {
        let r = route(
            "              - header_value_match: { descriptor_value: free, headers: [{ name: x-plan, exact_match: free }] }\n              - query_parameter: { query_parameter_name: key, descriptor_key: k }\n",
        );
        let mut h = HeaderMap::new();
        h.append("x-plan", "free".parse().unwrap());
        assert_eq!(check_single_inputs(&r, &h, Some("key=1&x=2&x=3")), Ok(()));
        assert!(matches!(
            check_single_inputs(&r, &h, Some("key=1&%6Bey=2")),
            Err(AmbiguousInput::RepeatedQueryParameter { .. })
        ));
        h.append("x-plan", "pro".parse().unwrap());
        assert!(matches!(
            check_single_inputs(&r, &h, Some("key=1")),
            Err(AmbiguousInput::RepeatedHeader { .. })
        ));
    }
}
