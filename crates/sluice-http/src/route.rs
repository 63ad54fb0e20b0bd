//! Which route a request takes. A route is a limit on a resource, so it must match every
//! spelling the upstream serves as that resource: Express, Rails, Spring, Tomcat and IIS serve
//! `/login/`, `/LOGIN` and `/login;jsessionid=1` as `/login`, and answer `HEAD` with their
//! `GET` handler. By default ([`PathMatching`]'s `false` fields) routes match those spellings
//! too; each setting keeps one distinction for an upstream that really makes it.
//!
//! A path with `;` parameters is compared in both readings, with and without its parameters,
//! and a route that fits either takes it: an upstream that keeps `;` as data (Express reads
//! `/orders/;x` as the order `;x`) and one that strips it (Tomcat reads `/login;x` as
//! `/login`) are both covered. A dot segment with parameters (`/x/..;/login`), which only a
//! parameter-stripping upstream resolves, is refused (Tomcat's path traversal spelling).

use std::borrow::Cow;

use http::Method;
use sluice_config::{PathMatching, Route, RouteMatch};

use crate::path::{InvalidPath, normalize_path};

/// A normalized request path as the routes see it (see the module docs).
#[derive(Clone, Debug)]
pub struct RoutePath<'a> {
    /// The normalized path, `;` parameters kept.
    with_parameters: &'a str,
    /// The path without its `;` parameters (dot segments resolved again), when it has any
    /// and they are ignored.
    without_parameters: Option<String>,
    matching: PathMatching,
}

impl<'a> RoutePath<'a> {
    /// The route view of `normalized` (a path [`normalize_path`] returned).
    ///
    /// # Errors
    /// [`InvalidPath::DotSegmentWithParameters`] for `..;x` or `.;x` segments (unless
    /// `strict_path_parameters`).
    pub fn new(normalized: &'a str, matching: PathMatching) -> Result<Self, InvalidPath> {
        let without_parameters = if matching.strict_path_parameters || !normalized.contains(';') {
            None
        } else {
            Some(strip_parameters(normalized)?)
        };
        Ok(Self {
            with_parameters: normalized,
            without_parameters,
            matching,
        })
    }

    /// The path's one canonical spelling (parameters removed, no trailing slash, lower case,
    /// each unless its setting keeps it): the value of the `path` action on a route without a
    /// template, so every spelling of a path counts against one descriptor.
    pub fn canonical(&self) -> Cow<'_, str> {
        let base = self
            .without_parameters
            .as_deref()
            .unwrap_or(self.with_parameters);
        let base = trim_slash(base, self.matching);
        if self.matching.case_sensitive || !base.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Borrowed(base)
        } else {
            Cow::Owned(base.to_ascii_lowercase())
        }
    }

    fn readings(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.with_parameters).chain(self.without_parameters.as_deref())
    }
}

/// Removes each segment's `;` part, then merges and resolves what that leaves (`/;x/login` is
/// `/login`). A dot segment that had parameters is an error.
fn strip_parameters(path: &str) -> Result<String, InvalidPath> {
    let mut out = String::with_capacity(path.len());
    for segment in path.split('/').skip(1) {
        let name = match segment.split_once(';') {
            Some((name, _)) if name == "." || name == ".." => {
                return Err(InvalidPath::DotSegmentWithParameters);
            }
            Some((name, _)) => name,
            None => segment,
        };
        out.push('/');
        out.push_str(name);
    }
    Ok(normalize_path(&out)?.into_owned())
}

fn trim_slash(path: &str, matching: PathMatching) -> &str {
    if matching.strict_trailing_slash || path.len() <= 1 {
        path
    } else {
        path.strip_suffix('/').unwrap_or(path)
    }
}

fn same(a: &str, b: &str, matching: PathMatching) -> bool {
    if matching.case_sensitive {
        a == b
    } else {
        a.eq_ignore_ascii_case(b)
    }
}

fn starts_with(path: &str, prefix: &str, matching: PathMatching) -> bool {
    path.len() >= prefix.len()
        && path.is_char_boundary(prefix.len())
        && same(&path[..prefix.len()], prefix, matching)
}

/// Whether `m` takes a request with this method and path. A `GET` route takes `HEAD` too
/// unless `strict_head`: servers answer `HEAD` with the `GET` handler.
pub fn route_matches(m: &RouteMatch, method: &Method, path: &RoutePath<'_>) -> bool {
    let matching = path.matching;
    if let Some(want) = &m.method
        && want != method.as_str()
        && !(want == "GET" && *method == Method::HEAD && !matching.strict_head)
    {
        return false;
    }
    path.readings().any(|p| path_fits(m, p, matching))
}

fn path_fits(m: &RouteMatch, path: &str, matching: PathMatching) -> bool {
    if let Some(want) = &m.path {
        return same(
            trim_slash(path, matching),
            trim_slash(want, matching),
            matching,
        );
    }
    if let Some(prefix) = &m.path_prefix {
        // `/api` is the `/api/` prefix's own directory when trailing slashes are ignored.
        return starts_with(path, prefix, matching)
            || (!matching.strict_trailing_slash
                && prefix.len() > 1
                && same(path, trim_slash(prefix, matching), matching));
    }
    if let Some(template) = &m.path_template {
        return template_matches(
            trim_slash(template, matching),
            trim_slash(path, matching),
            matching,
        );
    }
    true
}

/// `/users/{id}` matches `/users/42`, not `/users/42/x` nor `/users/`.
fn template_matches(template: &str, path: &str, matching: PathMatching) -> bool {
    let mut t = template.split('/');
    let mut p = path.split('/');
    loop {
        match (t.next(), p.next()) {
            (None, None) => return true,
            (Some(ts), Some(ps)) => {
                let is_param = ts.starts_with('{') && ts.ends_with('}');
                if (is_param && ps.is_empty()) || (!is_param && !same(ts, ps, matching)) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

/// The first of `routes` that takes the request.
pub fn find_route<'r>(
    routes: &'r [Route],
    method: &Method,
    path: &RoutePath<'_>,
) -> Option<&'r Route> {
    routes
        .iter()
        .find(|r| route_matches(&r.matcher, method, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> RouteMatch {
        RouteMatch {
            path: Some(p.into()),
            ..Default::default()
        }
    }

    fn fits(m: &RouteMatch, method: Method, p: &str, matching: PathMatching) -> bool {
        let normalized = normalize_path(p).unwrap();
        RoutePath::new(&normalized, matching).is_ok_and(|rp| route_matches(m, &method, &rp))
    }

    #[test]
    fn spellings_of_a_path_match_its_route_by_default() {
        let login = path("/login");
        let d = PathMatching::default();
        for p in [
            "/login",
            "/login/",
            "/LOGIN",
            "/Login/",
            "/login;jsessionid=1",
            "/login;a=b/",
            "/login/.",
            "/;x/login",
            "/x/../login",
        ] {
            assert!(fits(&login, Method::GET, p, d), "{p}");
        }
        assert!(!fits(&login, Method::GET, "/login2", d));
        assert!(!fits(&login, Method::GET, "/log/in", d));
    }

    #[test]
    fn templates_and_prefixes_take_the_same_spellings() {
        let d = PathMatching::default();
        let orders = RouteMatch {
            path_template: Some("/orders/{id}".into()),
            ..Default::default()
        };
        for p in [
            "/orders/17",
            "/orders/17/",
            "/ORDERS/17",
            "/orders/17;v=1",
            "/orders/;x",
        ] {
            assert!(fits(&orders, Method::GET, p, d), "{p}");
        }
        assert!(!fits(&orders, Method::GET, "/orders/", d));
        assert!(!fits(&orders, Method::GET, "/orders/17/x", d));
        let api = RouteMatch {
            path_prefix: Some("/api/".into()),
            ..Default::default()
        };
        for p in ["/api/x", "/API/x", "/api", "/api;x/y"] {
            assert!(fits(&api, Method::GET, p, d), "{p}");
        }
        assert!(!fits(&api, Method::GET, "/apix", d));
    }

    #[test]
    fn head_is_get_unless_strict() {
        let get = RouteMatch {
            path: Some("/login".into()),
            method: Some("GET".into()),
            ..Default::default()
        };
        let d = PathMatching::default();
        assert!(fits(&get, Method::HEAD, "/login", d));
        assert!(!fits(&get, Method::POST, "/login", d));
        let strict = PathMatching {
            strict_head: true,
            ..d
        };
        assert!(!fits(&get, Method::HEAD, "/login", strict));
    }

    #[test]
    fn each_setting_keeps_its_distinction() {
        let login = path("/login");
        let case = PathMatching {
            case_sensitive: true,
            ..Default::default()
        };
        assert!(!fits(&login, Method::GET, "/LOGIN", case));
        assert!(fits(&login, Method::GET, "/login/", case));
        let slash = PathMatching {
            strict_trailing_slash: true,
            ..Default::default()
        };
        assert!(!fits(&login, Method::GET, "/login/", slash));
        assert!(fits(&login, Method::GET, "/LOGIN", slash));
        let params = PathMatching {
            strict_path_parameters: true,
            ..Default::default()
        };
        assert!(!fits(&login, Method::GET, "/login;x=1", params));
        assert!(
            RoutePath::new("/x/..;/y", params).is_ok(),
            "`..;` is data then"
        );
    }

    #[test]
    fn dot_segments_with_parameters_are_refused() {
        let d = PathMatching::default();
        for p in ["/x/..;/login", "/.;x/login", "/a/..;jsessionid=1"] {
            let n = normalize_path(p).unwrap();
            assert_eq!(
                RoutePath::new(&n, d).unwrap_err(),
                InvalidPath::DotSegmentWithParameters,
                "{p}"
            );
        }
    }

    #[test]
    fn the_canonical_spelling() {
        let d = PathMatching::default();
        let c = |p: &str| RoutePath::new(p, d).unwrap().canonical().into_owned();
        assert_eq!(c("/Login;jsessionid=1/"), "/login");
        assert_eq!(c("/"), "/");
        assert_eq!(c("/a/"), "/a");
        let keep = PathMatching {
            case_sensitive: true,
            strict_trailing_slash: true,
            strict_path_parameters: true,
            strict_head: true,
            ..Default::default()
        };
        assert_eq!(RoutePath::new("/A;b/", keep).unwrap().canonical(), "/A;b/");
    }
}
