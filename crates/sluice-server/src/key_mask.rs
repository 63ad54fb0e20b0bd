//! Keys as the status page shows them. A rule's key is its descriptor's values; a value may be
//! an API key or a token taken from a header, and the
//! status page and `/status.json` must not hand it to whoever can read them. By default a
//! value longer than [`SHOWN_IN_FULL`] bytes that is not an IP address or network is shown as
//! its first [`PREFIX`] characters, `…` and the first 8 hex digits of its SHA-256 (so an
//! operator can still tell keys apart and find one: `printf %s VALUE | sha256sum`).

use std::fmt::Write as _;
use std::net::IpAddr;

/// Values up to this many bytes are shown as they are (user ids, names, ports).
const SHOWN_IN_FULL: usize = 16;
/// Characters kept of a longer value.
const PREFIX: usize = 6;

/// `key` (as the engine shows it: values with ` / ` between them) with every value that may
/// be a secret masked.
pub(crate) fn mask(key: &str) -> String {
    if key.starts_with("sha256:") {
        return key.to_owned();
    }
    key.split(" / ")
        .map(masked_value)
        .collect::<Vec<_>>()
        .join(" / ")
}

fn is_address(value: &str) -> bool {
    let address = value.split_once('/').map_or(value, |(a, _)| a);
    address.parse::<IpAddr>().is_ok()
}

fn masked_value(value: &str) -> String {
    if value.len() <= SHOWN_IN_FULL || is_address(value) {
        return value.to_owned();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let mut out: String = value.chars().take(PREFIX).collect();
    out.push('…');
    for b in &digest.as_ref()[..4] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_masked_and_names_and_addresses_are_not() {
        assert_eq!(mask("alice"), "alice");
        assert_eq!(mask("10.0.0.7"), "10.0.0.7");
        assert_eq!(mask("2001:db8:1:2::/64"), "2001:db8:1:2::/64");
        let secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
        let shown = mask(&format!("login / {secret}"));
        assert!(shown.starts_with("login / sk_liv…"), "{shown}");
        assert!(!shown.contains("4eC39HqLyjWDarjtT1zdp7dc"), "{shown}");
        assert_eq!(shown, mask(&format!("login / {secret}")));
        let digest = format!("sha256:{}", "ab".repeat(16));
        assert_eq!(mask(&digest), digest);
        // Multibyte values are cut on character boundaries.
        assert!(mask(&"é".repeat(20)).starts_with("éééééé…"));
    }
}
