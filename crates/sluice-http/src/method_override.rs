//! A request that names another method than its own. Express's `method-override`, Symfony,
//! Laravel, Rails (Rack) and Spring's `HiddenHttpMethodFilter` serve `POST` with
//! `X-HTTP-Method-Override: DELETE` (or `X-HTTP-Method`, `X-Method-Override`, `?_method=DELETE`)
//! as `DELETE`; an upstream without such a filter serves it as `POST`. Whichever method the
//! limiter matched, one kind of upstream serves the other: counted as `DELETE`, it walks past
//! a `POST` limit on the second kind; counted as `POST`, past a `DELETE` limit on the first.
//! So when the routes tell methods apart such a request is refused (400), unless
//! `ignore_method_override`; the client sends the method itself.
//!
//! Rack reads `X_HTTP_Method_Override` as `X-HTTP-Method-Override` (both are
//! `HTTP_X_HTTP_METHOD_OVERRIDE`): underscore spellings are overrides too, and `_method` is
//! found in any case and after a `;` ([`crate::query`]).

use http::{HeaderMap, Method};
use sluice_config::{Action, PathMatching, Route};

use crate::query::{QueryReading, query_params};
use crate::single_value::AmbiguousInput;
use crate::value::query_value;

/// The headers that name a method, lower case, `-` spelled.
const OVERRIDE_HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Whether any route matches on a method or reads it: only then can an override escape.
fn methods_told_apart(routes: &[Route]) -> bool {
    routes.iter().any(|r| {
        r.matcher.method.is_some()
            || r.rate_limits
                .iter()
                .flatten()
                .any(|a| matches!(a, Action::Method { .. }))
    })
}

fn is_override_header(name: &str) -> bool {
    OVERRIDE_HEADERS.iter().any(|o| {
        o.len() == name.len()
            && o.bytes()
                .zip(name.bytes())
                .all(|(a, b)| a == b || (a == b'-' && b == b'_'))
    })
}

/// The first override in the request that names a method other than `method`: (where, what).
fn other_method<'a>(
    method: &Method,
    headers: &'a HeaderMap,
    query: Option<&'a str>,
) -> Option<(&'a str, String)> {
    let differs = |named: &str| {
        let named = named.trim();
        !named.is_empty() && !named.eq_ignore_ascii_case(method.as_str())
    };
    for (name, value) in headers {
        if is_override_header(name.as_str()) {
            let named = crate::value::descriptor_value(value.as_bytes());
            if differs(&named) {
                return Some((name.as_str(), named.into_owned()));
            }
        }
    }
    // Found in every spelling, whatever the query settings: refusing more is the safe side.
    query_params(query, "_method", QueryReading::default())
        .map(|found| query_value(found.value))
        .find(|named| differs(named))
        .map(|named| ("_method", named.into_owned()))
}

/// Refuses a request that names another method than its own (see the module docs), when
/// `routes` tell methods apart and `matching` does not say `ignore_method_override`.
///
/// # Errors
/// [`AmbiguousInput::MethodOverride`] for the first override found.
pub fn check_method_override(
    routes: &[Route],
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
    matching: PathMatching,
) -> Result<(), AmbiguousInput> {
    if matching.ignore_method_override {
        return Ok(());
    }
    match other_method(method, headers, query) {
        Some((via, named)) if methods_told_apart(routes) => Err(AmbiguousInput::MethodOverride {
            via: via.chars().take(64).collect(),
            named: named.chars().take(16).collect(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(matcher: &str) -> Vec<Route> {
        let yaml = format!(
            "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:2\n    domain: d\n    routes:\n      - match: {matcher}\n        rate_limits:\n          - actions: [{{ generic_key: {{ descriptor_value: x }} }}]\n"
        );
        sluice_config::parse_service(std::path::Path::new("t.yaml"), &yaml)
            .unwrap()
            .gateways
            .remove(0)
            .routes
    }

    fn header(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        h
    }

    #[test]
    fn an_override_naming_another_method_is_refused() {
        let r = routes("{ path: /items, method: DELETE }");
        let d = PathMatching::default();
        let none = HeaderMap::new();
        for name in [
            "X-HTTP-Method-Override",
            "x-http-method",
            "X-Method-Override",
            "X_HTTP_Method_Override",
        ] {
            let h = header(name, "DELETE");
            assert!(
                matches!(
                    check_method_override(&r, &Method::POST, &h, None, d),
                    Err(AmbiguousInput::MethodOverride { .. })
                ),
                "{name}"
            );
        }
        for q in ["_method=DELETE", "x=1;_METHOD=delete", "_%6Dethod=DELETE"] {
            assert!(
                check_method_override(&r, &Method::POST, &none, Some(q), d).is_err(),
                "{q}"
            );
        }
        let same = header("x-http-method-override", "post");
        assert_eq!(
            check_method_override(&r, &Method::POST, &same, None, d),
            Ok(())
        );
        let empty = header("x-http-method-override", " ");
        assert_eq!(
            check_method_override(&r, &Method::POST, &empty, None, d),
            Ok(())
        );
        let other = header("x-http-methods", "DELETE");
        assert_eq!(
            check_method_override(&r, &Method::POST, &other, None, d),
            Ok(())
        );
    }

    #[test]
    fn only_where_methods_matter_and_unless_ignored() {
        let h = header("x-http-method-override", "DELETE");
        let d = PathMatching::default();
        let paths_only = routes("{ path: /items }");
        assert_eq!(
            check_method_override(&paths_only, &Method::POST, &h, None, d),
            Ok(())
        );
        let r = routes("{ path: /items, method: DELETE }");
        let ignore = PathMatching {
            ignore_method_override: true,
            ..d
        };
        assert_eq!(
            check_method_override(&r, &Method::POST, &h, None, ignore),
            Ok(())
        );
    }
}
