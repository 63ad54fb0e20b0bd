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

use crate::query::{QueryReading, query_params};

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
    /// A query parameter a descriptor reads has a value that runs on after a `;`.
    #[error(
        "the value of the query parameter `{name}` holds a `;`, which some servers read as a separator and others as data; a rate limit reads it, encode the `;` as %3B"
    )]
    QueryValueWithSemicolon {
        /// The parameter's name.
        name: String,
    },
    /// The request names another method than its own.
    #[error(
        "the request names the method `{named}` in `{via}`, which some servers serve as its method; a rate limit tells methods apart, send `{named}` itself"
    )]
    MethodOverride {
        /// Where: the header's or query parameter's name (at most 64 bytes of it).
        via: String,
        /// The method named (at most 16 bytes of it).
        named: String,
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
/// that no header is an underscore spelling of one of them, and that no such parameter's value
/// holds a `;`. Parameters are found as `reading` says ([`QueryReading`]: by
/// default after a `;` and in any case, so `user=a&USER=b` and `user=a;user=b` are repeats).
///
/// # Errors
/// The first input that is not single, as [`AmbiguousInput`].
pub fn check_single_inputs(
    route: &Route,
    headers: &HeaderMap,
    query: Option<&str>,
    reading: QueryReading,
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
        let Action::QueryParameter { name, .. } = action else {
            continue;
        };
        let mut found = query_params(query, name, reading);
        match (found.next(), found.next()) {
            (Some(_), Some(_)) => {
                return Err(AmbiguousInput::RepeatedQueryParameter { name: name.clone() });
            }
            (Some(one), None) if one.cut_at_semicolon => {
                return Err(AmbiguousInput::QueryValueWithSemicolon { name: name.clone() });
            }
            _ => {}
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
        let d = QueryReading::default();
        let r = route(
            "              - request_headers: { header_name: X-User-Id, descriptor_key: user }\n",
        );
        let mut h = HeaderMap::new();
        h.append("x-user-id", "a".parse().unwrap());
        assert_eq!(check_single_inputs(&r, &h, None, d), Ok(()));
        h.append("x-user-id", "b".parse().unwrap());
        assert!(matches!(
            check_single_inputs(&r, &h, None, d),
            Err(AmbiguousInput::RepeatedHeader { .. })
        ));
        let mut h = HeaderMap::new();
        h.append("x-user-id", "a".parse().unwrap());
        h.append("x_user-id", "b".parse().unwrap());
        assert!(matches!(
            check_single_inputs(&r, &h, None, d),
            Err(AmbiguousInput::HeaderAlias { .. })
        ));
        let mut h = HeaderMap::new();
        h.append("x_other", "b".parse().unwrap());
        assert_eq!(check_single_inputs(&r, &h, None, d), Ok(()), "unrelated");
    }

    #[test]
    fn header_matchers_and_query_parameters_too() {
        let d = QueryReading::default();
        let r = route(
            "              - header_value_match: { descriptor_value: free, headers: [{ name: x-plan, exact_match: free }] }\n              - query_parameter: { query_parameter_name: key, descriptor_key: k }\n",
        );
        let mut h = HeaderMap::new();
        h.append("x-plan", "free".parse().unwrap());
        assert_eq!(
            check_single_inputs(&r, &h, Some("key=1&x=2&x=3"), d),
            Ok(())
        );
        assert!(matches!(
            check_single_inputs(&r, &h, Some("key=1&%6Bey=2"), d),
            Err(AmbiguousInput::RepeatedQueryParameter { .. })
        ));
        h.append("x-plan", "pro".parse().unwrap());
        assert!(matches!(
            check_single_inputs(&r, &h, Some("key=1"), d),
            Err(AmbiguousInput::RepeatedHeader { .. })
        ));
    }

    #[test]
    fn a_parameter_in_another_case_or_after_a_semicolon_is_a_repeat() {
        let d = QueryReading::default();
        let r = route(
            "              - query_parameter: { query_parameter_name: user, descriptor_key: user }\n",
        );
        let h = HeaderMap::new();
        let check = |q: &str, reading| check_single_inputs(&r, &h, Some(q), reading);
        for ok in [
            "user=bob",
            "USER=bob",
            "x=1;user=bob",
            "q=a;b&user=bob",
            "user;x=1",
        ] {
            assert_eq!(check(ok, d), Ok(()), "{ok}");
        }
        for repeat in ["user=a&USER=b", "user=a;user=b", "x=1;User=a&user=b"] {
            assert!(
                matches!(
                    check(repeat, d),
                    Err(AmbiguousInput::RepeatedQueryParameter { .. })
                ),
                "{repeat}"
            );
        }
        for cut in ["user=bob;x=1", "x=1&User=bob;", "user=a;b=c"] {
            assert!(
                matches!(
                    check(cut, d),
                    Err(AmbiguousInput::QueryValueWithSemicolon { .. })
                ),
                "{cut}"
            );
        }
        let strict = QueryReading {
            strict_separators: true,
            strict_names: true,
        };
        assert_eq!(check("user=a&USER=b", strict), Ok(()));
        assert_eq!(check("user=bob;x=1", strict), Ok(()));
    }
}
