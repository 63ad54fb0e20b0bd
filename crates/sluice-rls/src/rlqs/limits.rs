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
    /// Streams one peer address may hold open at once; more are refused with
    /// `RESOURCE_EXHAUSTED`.
    pub max_streams_per_peer: usize,
    /// Buckets one stream may hold; usage of more is neither counted nor answered (Envoy keeps
    /// its `no_assignment_behavior` for them).
    pub max_buckets_per_stream: usize,
    /// Buckets the demand book holds across all streams (`DemandBook`).
    pub max_tracked_buckets: usize,
    /// Bucket usages one stream may have processed per second (Envoy sends one report per new
    /// bucket at once, then all its buckets every 5 s); faster reports wait, so the HTTP/2
    /// window pushes back on the sender.
    pub usages_per_second: u32,
    /// Largest report message, in bytes.
    pub max_message_bytes: usize,
    /// How long a response may wait for the peer to read the previous ones; a stream whose
    /// peer reads nothing for this long is ended.
    pub send_timeout: Duration,
}

impl Default for RlqsLimits {
    fn default() -> Self {
        Self {
            max_streams_per_peer: 16,
            max_buckets_per_stream: 10_000,
            max_tracked_buckets: 200_000,
            usages_per_second: 5_000,
            max_message_bytes: 1024 * 1024,
            send_timeout: Duration::from_secs(30),
        }
    }
}

/// Open streams per peer address.
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

impl PeerStreams {
    /// A slot for one more stream of `peer`, or `None` when it holds `max` already.
    pub fn enter(self: &Arc<Self>, peer: Option<IpAddr>, max: usize) -> Option<StreamSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(peer).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
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
        self.tokens -= usages.max(1) as f64;
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
        let ip: Option<IpAddr> = Some([10, 0, 0, 1].into());
        let a = peers.enter(ip, 2).unwrap();
        let _b = peers.enter(ip, 2).unwrap();
        assert!(peers.enter(ip, 2).is_none());
        assert!(peers.enter(Some([10, 0, 0, 2].into()), 2).is_some());
        drop(a);
        assert!(peers.enter(ip, 2).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn reports_beyond_the_pace_wait() {
        let mut pace = ReportPace::new(100);
        assert_eq!(pace.take(100), Duration::ZERO);
        assert_eq!(pace.take(50), Duration::from_millis(500));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(pace.take(10), Duration::ZERO);
    }
}
