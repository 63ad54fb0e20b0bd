//! `rlqs:`: the bounds of the RLQS streams (Envoy's `rate_limit_quota` filter) on the gRPC
//! listener.

use std::time::Duration;

use crate::duration::{Bounds, bounded_count, bounded_duration};
use crate::error::Located;
use crate::raw::RawRlqs;

/// The bounds of RLQS streams (`rlqs:`); read at start.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RlqsSettings {
    /// Streams all peers together may hold open at once (`max_streams`, default 256).
    pub max_streams: usize,
    /// Largest report message in bytes (`max_report_bytes`, default 256 KiB).
    pub max_report_bytes: usize,
    /// Streams one peer address may hold open at once (`max_streams_per_peer`, default 16).
    pub max_streams_per_peer: usize,
    /// Buckets one stream may hold (`max_buckets_per_stream`, default 10,000).
    pub max_buckets_per_stream: usize,
    /// Bucket usages one stream may have processed per second (`usages_per_second`, default
    /// 5,000).
    pub usages_per_second: u32,
    /// How long a stream may send no report before it is ended (`idle_timeout`, default 60 s,
    /// 10 s to 1 h): Envoy reports every 5 s; a client reporting less often (gRPC's A77
    /// servers may) needs more.
    pub idle_timeout: Duration,
}

impl Default for RlqsSettings {
    fn default() -> Self {
        Self {
            max_streams: 256,
            max_report_bytes: 256 * 1024,
            max_streams_per_peer: 16,
            max_buckets_per_stream: 10_000,
            usages_per_second: 5_000,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The most memory the reports of all RLQS streams may take at once.
pub const REPORT_MEMORY_BUDGET: u64 = 1024 * 1024 * 1024;

/// What one stream may hold at once, at most, for reports of `max_report_bytes`: the bytes
/// received (up to twice a report while it arrives), the report kept undecoded, and its
/// answers in parts of 64 KiB (one being written, two waiting, one being sent).
pub fn stream_memory(max_report_bytes: u64) -> u64 {
    3 * max_report_bytes + 4 * 64 * 1024
}

/// `rlqs:` validated.
pub(crate) fn parse_rlqs(raw: &RawRlqs) -> Result<RlqsSettings, Located> {
    let d = RlqsSettings::default();
    let set = read_rlqs(raw, &d)?;
    let memory = set.max_streams as u64 * stream_memory(set.max_report_bytes as u64);
    if memory > REPORT_MEMORY_BUDGET {
        let at = raw.max_streams.as_ref().or(raw.max_report_bytes.as_ref());
        if let Some(at) = at {
            return Err(Located::at(
                at,
                format!(
                    "rlqs.max_streams x (3 x rlqs.max_report_bytes + 256 KiB) is {} MiB; at \
                     most {} MiB of reports are allowed: lower one of them",
                    memory >> 20,
                    REPORT_MEMORY_BUDGET >> 20
                ),
            ));
        }
    }
    Ok(set)
}

fn read_rlqs(raw: &RawRlqs, d: &RlqsSettings) -> Result<RlqsSettings, Located> {
    Ok(RlqsSettings {
        max_streams: bounded_count(
            "rlqs.max_streams",
            raw.max_streams.as_ref(),
            d.max_streams as u64,
            (1, 100_000),
            "streams of all peers together; each holds up to about 3 x max_report_bytes",
        )? as usize,
        max_report_bytes: bounded_count(
            "rlqs.max_report_bytes",
            raw.max_report_bytes.as_ref(),
            d.max_report_bytes as u64,
            (16 * 1024, 16 * 1024 * 1024),
            "Envoy sends all its buckets in one report, about 60 bytes each",
        )? as usize,
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
        idle_timeout: bounded_duration(
            "rlqs.idle_timeout",
            raw.idle_timeout.as_ref(),
            d.idle_timeout,
            &Bounds {
                min: Duration::from_secs(10),
                max: Duration::from_secs(3600),
                range: "10s and 1h",
                example: "`60s` or `5m`",
            },
        )?,
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
        let set = parse("allow_empty_rules: true\nrlqs:\n  idle_timeout: 5m\n").unwrap();
        assert_eq!(set.idle_timeout, Duration::from_secs(300));
        let err = parse("allow_empty_rules: true\nrlqs:\n  idle_timeout: 5s\n").unwrap_err();
        assert!(
            err.contains("rlqs.idle_timeout must be between 10s and 1h"),
            "{err}"
        );
    }

    #[test]
    fn streams_times_report_bytes_stay_within_the_memory_budget() {
        let set = parse(
            "allow_empty_rules: true\nrlqs:\n  max_streams: 1000\n  max_report_bytes: 65536\n",
        )
        .unwrap();
        assert_eq!((set.max_streams, set.max_report_bytes), (1000, 65536));
        let d = RlqsSettings::default();
        assert!(
            d.max_streams as u64 * stream_memory(d.max_report_bytes as u64) <= REPORT_MEMORY_BUDGET
        );
        let err = parse("allow_empty_rules: true\nrlqs:\n  max_streams: 2000\n").unwrap_err();
        assert!(err.contains("at most 1024 MiB"), "{err}");
        let err = parse("allow_empty_rules: true\nrlqs:\n  max_report_bytes: 100\n").unwrap_err();
        assert!(
            err.contains("rlqs.max_report_bytes must be between"),
            "{err}"
        );
    }
}
