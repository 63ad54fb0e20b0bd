//! The client address, in one canonical form wherever it comes from.
//!
//! A dual-stack socket (`[::]`) reports an IPv4 peer as the IPv4-mapped IPv6 address
//! `::ffff:a.b.c.d`. Read as IPv6, every IPv4 client shares `::/64` under a masked limit and
//! a rule written for `127.0.0.5` never sees `::ffff:127.0.0.5`. So every address that enters
//! a descriptor (the peer, an `X-Forwarded-For` entry) passes through [`canonical_ip`] here,
//! once: a mapped address is its IPv4 address, with IPv4 mask lengths and IPv4 text.

use std::net::IpAddr;

use http::HeaderMap;
use http::header::HeaderName;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `ip` in the form the limiter uses: an IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) is
/// the IPv4 address (`192.0.2.1`); every other address is itself.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// The client address, canonical: the peer, or with `trusted_hops` > 0 the address that many
/// entries from the right of `X-Forwarded-For` (those were appended by our own trusted
/// proxies). The header is read from the right and as bytes, so whatever a client wrote to
/// the left of the trusted entries (bytes that are not text, thousands of commas) changes
/// nothing. A malformed or too short header falls back to the peer.
pub fn client_address(
    headers: &HeaderMap,
    peer: Option<IpAddr>,
    trusted_hops: usize,
) -> Option<IpAddr> {
    let peer = peer.map(canonical_ip);
    if trusted_hops == 0 {
        return peer;
    }
    let entry = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .rev()
        .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','))
        .nth(trusted_hops - 1);
    entry
        .and_then(|e| std::str::from_utf8(e).ok())
        .and_then(|s| s.trim().parse().ok())
        .map(canonical_ip)
        .or(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn mapped_addresses_are_ipv4() {
        assert_eq!(canonical_ip(ip("::ffff:127.0.0.5")), ip("127.0.0.5"));
        assert_eq!(canonical_ip(ip("::ffff:7f00:5")), ip("127.0.0.5"));
        assert_eq!(canonical_ip(ip("2001:db8::1")), ip("2001:db8::1"));
        assert_eq!(canonical_ip(ip("::1")), ip("::1"), "loopback is not mapped");
        assert_eq!(canonical_ip(ip("192.0.2.1")), ip("192.0.2.1"));
    }

    #[test]
    fn forwarded_for_hops() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9, 10.0.0.2".parse().unwrap());
        let peer = Some(ip("10.0.0.3"));
        assert_eq!(client_address(&h, peer, 0), peer);
        assert_eq!(client_address(&h, peer, 1), Some(ip("10.0.0.2")));
        assert_eq!(client_address(&h, peer, 2), Some(ip("203.0.113.9")));
        assert_eq!(client_address(&h, peer, 5), peer, "too few hops: the peer");
        h.insert("x-forwarded-for", "not an address".parse().unwrap());
        assert_eq!(client_address(&h, peer, 1), peer, "malformed: the peer");
    }

    #[test]
    fn every_source_is_canonical() {
        let mut h = HeaderMap::new();
        let mapped = Some(ip("::ffff:198.51.100.7"));
        assert_eq!(client_address(&h, mapped, 0), Some(ip("198.51.100.7")));
        assert_eq!(client_address(&h, mapped, 1), Some(ip("198.51.100.7")));
        h.insert("x-forwarded-for", "::ffff:203.0.113.9".parse().unwrap());
        assert_eq!(client_address(&h, mapped, 1), Some(ip("203.0.113.9")));
    }

    #[test]
    fn forged_bytes_left_of_the_trusted_entries_change_nothing() {
        // A load balancer that appends to the client's own header line: the client's part is
        // not text, the trusted entry on its right still is the address.
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff\xfe, 1.2.3.4, 203.0.113.9").unwrap(),
        );
        h.append("x-forwarded-for", "10.0.0.2".parse().unwrap());
        let peer = Some(ip("10.0.0.3"));
        assert_eq!(client_address(&h, peer, 1), Some(ip("10.0.0.2")));
        assert_eq!(client_address(&h, peer, 2), Some(ip("203.0.113.9")));
        let many = format!("{}203.0.113.9", ",".repeat(10_000));
        h.insert("x-forwarded-for", many.parse().unwrap());
        assert_eq!(client_address(&h, peer, 1), Some(ip("203.0.113.9")));
    }
}
