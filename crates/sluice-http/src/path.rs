//! Path normalization before routes match, as Envoy's `normalize_path` and `merge_slashes`
//! do: without it `//login`, `/./login` and `/%6cogin` would miss a `/login` route while the
//! upstream serves `/login` for each of them.

use std::borrow::Cow;

/// A path that cannot be normalized. The request is answered 400 (Envoy does the same), never
/// passed on unlimited: no route could match it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPath {
    /// A `%` not followed by two hex digits.
    #[error("the request path has a malformed percent-escape at byte {at}")]
    MalformedEscape {
        /// Byte offset of the `%`.
        at: usize,
    },
    /// Not an origin-form path (`/...`): `*` (`OPTIONS *`) or an authority (`CONNECT`).
    #[error("the request target is not a path starting with `/`")]
    NotOriginForm,
    /// A `.` or `..` segment with `;` parameters (`/x/..;/login`): an upstream that strips
    /// parameters (Tomcat) resolves it, one that does not keeps it, so no route can be sure.
    #[error("the request path has a dot segment with `;` parameters (`..;`)")]
    DotSegmentWithParameters,
    /// A backslash: not a URI character, and IIS reads it as `/`.
    #[error("the request path has a backslash at byte {at}")]
    Backslash {
        /// Byte offset of the backslash.
        at: usize,
    },
}

/// Normalizes an origin-form path (RFC 3986 section 6.2.2): percent-escapes of unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`) are decoded and the others' hex digits upper-cased,
/// runs of `/` become one, and `.` and `..` segments are resolved (never above the root).
/// Reserved escapes such as `%2F` stay as they are: they are data, not separators. A target
/// that does not start with `/` (`*`, an authority) is [`InvalidPath::NotOriginForm`]; one
/// with a backslash (IIS reads it as `/`) is [`InvalidPath::Backslash`].
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, InvalidPath> {
    if !path.starts_with('/') {
        return Err(InvalidPath::NotOriginForm);
    }
    if let Some(at) = path.find('\\') {
        return Err(InvalidPath::Backslash { at });
    }
    if is_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path)?;
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in decoded[1..].split('/') {
        trailing_slash = true;
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => {
                segments.push(s);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if trailing_slash || out.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// The common case, checked without allocating: nothing to decode, merge or resolve.
fn is_normal(path: &str) -> bool {
    !path.contains('%') && !path.contains("//") && !path.split('/').any(|s| s == "." || s == "..")
}

fn decode_unreserved(path: &str) -> Result<String, InvalidPath> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            // Bytes other than `%` are copied whole characters at a time.
            let end = path[i..].find('%').map_or(path.len(), |n| i + n);
            out.push_str(&path[i..end]);
            i = end;
            continue;
        }
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .ok_or(InvalidPath::MalformedEscape { at: i })?;
        let value = (hex_digit(hex[0]) << 4) | hex_digit(hex[1]);
        if value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(value));
        } else {
            out.push('%');
            out.push(char::from(hex[0].to_ascii_uppercase()));
            out.push(char::from(hex[1].to_ascii_uppercase()));
        }
        i += 3;
    }
    Ok(out)
}

fn hex_digit(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> String {
        normalize_path(p).unwrap().into_owned()
    }

    #[test]
    fn the_bypasses_all_become_the_route() {
        for p in [
            "/login",
            "//login",
            "///login",
            "/./login",
            "/%6cogin",
            "/%6Cogin",
            "/x/../login",
            "/../login",
            "/%2e/login",
            "/%2E%2E/login",
            "/a/b/../../login",
        ] {
            assert_eq!(norm(p), "/login", "{p}");
        }
    }

    #[test]
    fn shapes_are_kept() {
        assert_eq!(norm("/"), "/");
        assert_eq!(norm("/users/"), "/users/");
        assert_eq!(norm("/users//"), "/users/");
        assert_eq!(norm("/a/b/.."), "/a/");
        assert_eq!(norm("/a/."), "/a/");
        assert_eq!(norm("/.."), "/");
        assert_eq!(normalize_path("*"), Err(InvalidPath::NotOriginForm));
        assert_eq!(normalize_path(""), Err(InvalidPath::NotOriginForm));
        assert!(matches!(
            normalize_path("/plain/path"),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn reserved_escapes_stay_and_are_upper_cased() {
        assert_eq!(norm("/a%2fb"), "/a%2Fb");
        assert_eq!(norm("/a%20b"), "/a%20b");
        assert_eq!(norm("/%c3%a9"), "/%C3%A9");
    }

    #[test]
    fn broken_escapes_are_errors() {
        assert_eq!(
            normalize_path("/a%zz"),
            Err(InvalidPath::MalformedEscape { at: 2 })
        );
        assert_eq!(
            normalize_path("/a%2"),
            Err(InvalidPath::MalformedEscape { at: 2 })
        );
        assert_eq!(
            normalize_path("/%"),
            Err(InvalidPath::MalformedEscape { at: 1 })
        );
        assert_eq!(
            normalize_path("/x\\..\\login"),
            Err(InvalidPath::Backslash { at: 2 })
        );
    }
}
