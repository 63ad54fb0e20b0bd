//! Descriptor values from request bytes: never skipped, never unbounded.
//!
//! A header or query value is hostile input. Two rules keep it from walking past a limit or
//! filling memory:
//! - **Bytes, not text.** A value that is not UTF-8 is still a value (Envoy uses the raw
//!   bytes): it is read byte for byte as Latin-1, so every distinct byte string stays a
//!   distinct descriptor value and none is dropped. Skipping it would let a client that adds
//!   one byte >= 0x80 to its id go unlimited.
//! - **Bounded length.** A value longer than [`MAX_VALUE_LEN`] bytes is replaced by
//!   `sha256:` and the first 128 bits of its SHA-256 in hex (39 bytes), the same on every
//!   instance, so long values (JWTs, cookies) are still limited one by one while a 100 KB
//!   header costs the limiter 39 bytes.

use std::borrow::Cow;

/// The longest descriptor value used as it is; the same cap as the gRPC and `/json` front
/// doors (which reject longer values, where the gateway hashes them).
pub const MAX_VALUE_LEN: usize = 1024;

/// The descriptor value of raw request bytes (see the module docs).
pub fn descriptor_value(bytes: &[u8]) -> Cow<'_, str> {
    if bytes.len() > MAX_VALUE_LEN {
        return Cow::Owned(hashed(bytes));
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => Cow::Owned(bytes.iter().map(|&b| char::from(b)).collect()),
    }
}

/// A query parameter's value, percent-decoded (`+` is a space, as HTML forms send it), so
/// `%61lice` and `alice` are one descriptor value, as the upstream sees them.
pub fn query_value(raw: &str) -> Cow<'_, str> {
    if !raw.contains(['%', '+']) {
        return descriptor_value(raw.as_bytes());
    }
    let spaced = raw.replace('+', " ");
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(&spaced).collect();
    Cow::Owned(descriptor_value(&decoded).into_owned())
}

fn hashed(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(39);
    sluice_engine::write_digest(&mut out, bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_borrowed_as_it_is() {
        assert!(matches!(descriptor_value(b"alice"), Cow::Borrowed("alice")));
        assert_eq!(descriptor_value("zoë".as_bytes()), "zoë");
    }

    #[test]
    fn other_bytes_are_distinct_values_never_dropped() {
        let a = descriptor_value(b"alice\xff");
        let b = descriptor_value(b"alice\xfe");
        assert_eq!(a, "alice\u{ff}");
        assert_ne!(a, b);
        assert_ne!(a, descriptor_value(b"alice"));
    }

    #[test]
    fn long_values_are_hashed_to_a_fixed_size() {
        let long = vec![b'x'; 100_000];
        let h = descriptor_value(&long);
        assert_eq!(h.len(), 39);
        assert!(h.starts_with("sha256:"));
        assert_eq!(h, descriptor_value(&long), "stable");
        let mut other = long.clone();
        other[50_000] = b'y';
        assert_ne!(h, descriptor_value(&other));
        let edge = vec![b'a'; MAX_VALUE_LEN];
        assert_eq!(
            descriptor_value(&edge).len(),
            MAX_VALUE_LEN,
            "at the cap: as it is"
        );
    }

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(query_value("%61lice"), "alice");
        assert_eq!(query_value("a+b"), "a b");
        assert_eq!(query_value("a%20b"), "a b");
        assert_eq!(query_value("plain"), "plain");
        assert_eq!(query_value("%ff"), "\u{ff}");
        assert_eq!(query_value("%zz"), "%zz", "a broken escape stays as it is");
    }
}
