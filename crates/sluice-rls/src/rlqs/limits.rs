//! The bounds of the RLQS door: a stream is a front door like the others, and anything that
//! speaks the protocol may send millions of bucket ids, open streams without end or never
//! read its responses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The bounds of every stream.
#[derive(Clone, Debug)]
pub struct RlqsLimits {
    /// Streams all peers together may hold open at once; more are refused with
    /// `RESOURCE_EXHAUSTED`. With `max_message_bytes`, it bounds the memory of reports.
    pub max_streams: usize,
    /// Streams one peer address may hold open at once; more are refused with
    /// `RESOURCE_EXHAUSTED`.
    pub max_streams_per_peer: usize,
    /// Buckets one stream may hold; usage of more is counted and answered, its assignment
    /// not kept.
    pub max_buckets_per_stream: usize,
    /// Buckets the demand book holds across all streams (`DemandBook`).
    pub max_tracked_buckets: usize,
    /// Bucket usages one stream may have processed per second (Envoy sends one report per new
    /// bucket at once, then all its buckets every 5 s); faster reports wait, so the HTTP/2
    /// window pushes back on the sender.
    pub usages_per_second: u32,
    /// Largest report message, in bytes: a stream holds a few times this at most (the bytes
    /// received, the report kept undecoded, answers in parts: wire.rs).
    pub max_message_bytes: usize,
    /// How long a response may wait for the peer to read the previous ones; a stream whose
    /// peer reads nothing for this long is ended.
    pub send_timeout: Duration,
    /// How long a stream may go without a report before it is ended. Envoy reports every
    /// bucket it holds every 5 s, and opens its stream with its first bucket's report; a
    /// stream that sends nothing for a minute while its connection stays busy (other streams
    /// on it, or a peer that only pings: the listener's `idle_timeout` closes only a silent
    /// connection) is one held open to take the slots Envoys need, and held a slot of its
    /// peer's (16) for good.
    pub idle_timeout: Duration,
}

impl Default for RlqsLimits {
    fn default() -> Self {
        Self {
            max_streams: 256,
            max_streams_per_peer: 16,
            max_buckets_per_stream: 10_000,
            max_tracked_buckets: 200_000,
            usages_per_second: 5_000,
            max_message_bytes: 256 * 1024,
            send_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl From<&sluice_config::RlqsSettings> for RlqsLimits {
    /// `rlqs:` of the service's config as the bounds (the others at their defaults).
    fn from(settings: &sluice_config::RlqsSettings) -> Self {
        Self {
            max_streams: settings.max_streams,
            max_message_bytes: settings.max_report_bytes,
            max_streams_per_peer: settings.max_streams_per_peer,
            max_buckets_per_stream: settings.max_buckets_per_stream,
            usages_per_second: settings.usages_per_second,
            idle_timeout: settings.idle_timeout,
            ..Self::default()
        }
    }
}

/// A peer as the per-peer cap counts it: an IPv4 address (IPv4-mapped IPv6 ones too), or the
/// /64 of an IPv6 address (one host commonly holds a whole /64, so its exact addresses are
/// free to spend).
fn peer_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// Open streams per peer (an IPv4 address or an IPv6 /64).
#[derive(Debug, Default)]
pub struct PeerStreams {
    open: Mutex<HashMap<Option<IpAddr>, usize>>,
}

/// A stream's place in [`PeerStreams`], given back when dropped.
#[derive(Debug)]
pub struct StreamSlot {
    peers: Arc<PeerStreams>,
    peer: Option<IpAddr>,
}

/// Why a stream is refused a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    /// The peer holds its most streams.
    #[error("this peer holds {0} rate limit quota streams already")]
    Peer(usize),
    /// All peers together hold the most streams.
    #[error("this server holds {0} rate limit quota streams already")]
    All(usize),
}

impl Full {
    /// The `reason` label of `sluice_rlqs_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Full::Peer(_) => "streams_per_peer",
            Full::All(_) => "streams",
        }
    }
}

impl PeerStreams {
    /// A slot for one more stream of `peer`, unless it holds `max_streams_per_peer` already
    /// or all peers together hold `max_streams`.
    pub fn enter(
        self: &Arc<Self>,
        peer: Option<IpAddr>,
        limits: &RlqsLimits,
    ) -> Result<StreamSlot, Full> {
        let peer = peer.map(peer_of);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = open.values().sum();
        if total >= limits.max_streams {
            return Err(Full::All(limits.max_streams));
        }
        let n = open.entry(peer).or_default();
        if *n >= limits.max_streams_per_peer {
            return Err(Full::Peer(limits.max_streams_per_peer));
        }
        *n += 1;
        Ok(StreamSlot {
            peers: self.clone(),
            peer,
        })
    }

    /// Streams open, all peers together.
    pub fn total(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// The pace of one stream's reports: a token bucket of bucket usages, one second of them as
/// burst. `wait` says how long the next report must wait.
#[derive(Debug)]
pub struct ReportPace {
    per_second: f64,
    tokens: f64,
    at: tokio::time::Instant,
}

impl ReportPace {
    /// A full pace of `per_second` usages.
    pub fn new(per_second: u32) -> Self {
        let per_second = f64::from(per_second.max(1));
        Self {
            per_second,
            tokens: per_second,
            at: tokio::time::Instant::now(),
        }
    }

    /// Takes `usages` (at least one: an empty report costs one) and returns how long to wait
    /// before processing them.
    pub fn take(&mut self, usages: usize) -> Duration {
        let now = tokio::time::Instant::now();
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        self.charge(usages.max(1) as u64)
    }

    /// Takes `extra` more (engine calls beyond the usual per usage) and returns how long to
    /// wait before the next report.
    pub fn charge(&mut self, extra: u64) -> Duration {
        self.tokens -= extra as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_at_most_its_streams_and_gets_them_back() {
        let peers = Arc::new(PeerStreams::default());
        let limits = RlqsLimits {
            max_streams_per_peer: 2,
            ..RlqsLimits::default()
        };
        let ip: Option<IpAddr> = Some([10, 0, 0, 1].into());
        let a = peers.enter(ip, &limits).unwrap();
        let _b = peers.enter(ip, &limits).unwrap();
        assert_eq!(peers.enter(ip, &limits).err(), Some(Full::Peer(2)));
        assert!(peers.enter(Some([10, 0, 0, 2].into()), &limits).is_ok());
        drop(a);
        assert!(peers.enter(ip, &limits).is_ok());
    }

    #[test]
    fn an_ipv6_peer_is_its_64_and_a_mapped_ipv4_peer_its_ipv4_address() {
        let peers = Arc::new(PeerStreams::default());
        let limits = RlqsLimits {
            max_streams_per_peer: 2,
            ..RlqsLimits::default()
        };
        let v6 = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let _a = peers.enter(v6("2001:db8:1:2::1"), &limits).unwrap();
        let _b = peers.enter(v6("2001:db8:1:2:ffff::9"), &limits).unwrap();
        let third = peers.enter(v6("2001:db8:1:2:abcd:1:2:3"), &limits);
        assert_eq!(third.err(), Some(Full::Peer(2)));
        assert!(peers.enter(v6("2001:db8:1:3::1"), &limits).is_ok());
        let _c = peers.enter(v6("::ffff:10.0.0.7"), &limits).unwrap();
        let _d = peers.enter(Some([10, 0, 0, 7].into()), &limits).unwrap();
        let fifth = peers.enter(v6("::ffff:10.0.0.7"), &limits);
        assert_eq!(fifth.err(), Some(Full::Peer(2)));
    }

    #[test]
    fn all_peers_together_hold_at_most_max_streams() {
        let peers = Arc::new(PeerStreams::default());
        let limits = RlqsLimits {
            max_streams: 3,
            ..RlqsLimits::default()
        };
        let slots: Vec<StreamSlot> = (1..=3u8)
            .map(|i| peers.enter(Some([10, 0, 0, i].into()), &limits).unwrap())
            .collect();
        let fourth = peers.enter(Some([10, 0, 0, 4].into()), &limits);
        assert_eq!(fourth.err(), Some(Full::All(3)));
        drop(slots);
        assert!(peers.enter(Some([10, 0, 0, 4].into()), &limits).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn reports_beyond_the_pace_wait() {
        let mut pace = ReportPace::new(100);
        assert_eq!(pace.take(100), Duration::ZERO);
        assert_eq!(pace.take(50), Duration::from_millis(500));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(pace.take(10), Duration::ZERO);
        assert_eq!(pace.charge(0), Duration::ZERO);
        assert_eq!(pace.charge(140), Duration::from_millis(500));
    }
}
