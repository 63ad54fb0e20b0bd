//! `rlqs:`: the bounds of the RLQS streams (Envoy's `rate_limit_quota` filter) on the gRPC
//! listener.

use crate::duration::bounded_count;
use crate::error::Located;
use crate::raw::RawRlqs;

/// The bounds of RLQS streams (`rlqs:`); read at start.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RlqsSettings {
    /// Streams one peer address may hold open at once (`max_streams_per_peer`, default 16).
    pub max_streams_per_peer: usize,
    /// Buckets one stream may hold (`max_buckets_per_stream`, default 10,000).
    pub max_buckets_per_stream: usize,
    /// Bucket usages one stream may have processed per second (`usages_per_second`, default
    /// 5,000).
    pub usages_per_second: u32,
}

impl Default for RlqsSettings {
    fn default() -> Self {
        Self {
            max_streams_per_peer: 16,
            max_buckets_per_stream: 10_000,
            usages_per_second: 5_000,
        }
    }
}

/// `rlqs:` validated.
pub(crate) fn parse_rlqs(raw: &RawRlqs) -> Result<RlqsSettings, Located> {
    let d = RlqsSettings::default();
    Ok(RlqsSettings {
        max_streams_per_peer: bounded_count(
            "rlqs.max_streams_per_peer",
            raw.max_streams_per_peer.as_ref(),
            d.max_streams_per_peer as u64,
            (1, 10_000),
            "an Envoy opens one stream per filter config and worker set",
        )? as usize,
        max_buckets_per_stream: bounded_count(
            "rlqs.max_buckets_per_stream",
            raw.max_buckets_per_stream.as_ref(),
            d.max_buckets_per_stream as u64,
            (1, 10_000_000),
            "each bucket a stream holds takes about 200 bytes",
        )? as usize,
        usages_per_second: bounded_count(
            "rlqs.usages_per_second",
            raw.usages_per_second.as_ref(),
            u64::from(d.usages_per_second),
            (1, 10_000_000),
            "Envoy reports each of its buckets every 5 s",
        )? as u32,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn parse(text: &str) -> Result<RlqsSettings, String> {
        crate::parse_service(Path::new("sluice.yaml"), text)
            .map(|c| c.rlqs)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn bounds_default_and_are_checked() {
        assert_eq!(
            parse("allow_empty_rules: true\n"),
            Ok(RlqsSettings::default())
        );
        let set = parse(
            "allow_empty_rules: true\nrlqs:\n  max_streams_per_peer: 4\n  usages_per_second: 100\n",
        )
        .unwrap();
        assert_eq!((set.max_streams_per_peer, set.usages_per_second), (4, 100));
        let err =
            parse("allow_empty_rules: true\nrlqs:\n  max_buckets_per_stream: 0\n").unwrap_err();
        assert!(
            err.contains("rlqs.max_buckets_per_stream must be between 1"),
            "{err}"
        );
        assert!(parse("allow_empty_rules: true\nrlqs:\n  reporting: 5\n").is_err());
    }
}
