//! What the etcd store remembers between flushes: the value and revision of each counter it
//! owns (so an increment is one compare-and-set transaction, without reading first) and the
//! leases its keys expire with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Clock, Nanos};

use super::client::Client;
use crate::StoreError;

/// One counter of this instance as last written or read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Own {
    pub value: u64,
    /// etcd's `mod_revision` of the counter.
    pub revision: i64,
    /// When the counter's window is over for good (its TTL from the last write).
    pub expires_at: Nanos,
}

/// The counters this instance owns, by etcd key. Entries past their TTL are dropped when the
/// map has doubled since the last sweep, so it holds at most about twice the keys flushed in
/// one TTL.
#[derive(Default)]
pub(crate) struct Owned {
    counters: parking_lot::Mutex<(HashMap<Vec<u8>, Own>, usize)>,
}

const MIN_SWEEP: usize = 4096;

impl Owned {
    pub(crate) fn get(&self, key: &[u8]) -> Option<Own> {
        self.counters.lock().0.get(key).copied()
    }

    pub(crate) fn set(&self, key: Vec<u8>, own: Own, now: Nanos) {
        let mut guard = self.counters.lock();
        let (map, swept_at) = &mut *guard;
        map.insert(key, own);
        if map.len() > (*swept_at * 2).max(MIN_SWEEP) {
            map.retain(|_, o| o.expires_at > now);
            *swept_at = map.len();
        }
    }

    pub(crate) fn forget(&self, key: &[u8]) {
        self.counters.lock().0.remove(key);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.counters.lock().0.len()
    }
}

/// A lease granted for keys that must live `ttl_s` seconds.
#[derive(Clone, Copy)]
struct Granted {
    id: i64,
    /// Keys attached after this would expire too early.
    usable_until: Nanos,
}

/// One lease per key lifetime, granted half as long again as the lifetime and used for the
/// first half of that slack: each key lives between its TTL and 1.5 times it, and the store
/// grants one lease per lifetime every TTL/2 at most.
pub(crate) struct Leases {
    granted: tokio::sync::Mutex<HashMap<u64, Granted>>,
    clock: Arc<dyn Clock>,
}

impl Leases {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            granted: tokio::sync::Mutex::new(HashMap::new()),
            clock,
        }
    }

    /// A lease that keeps a key written now for at least `ttl`.
    pub(crate) async fn for_ttl(&self, client: &Client, ttl: Duration) -> Result<i64, StoreError> {
        let ttl_s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let ttl_s = ttl_s.max(1);
        let mut granted = self.granted.lock().await;
        let now = self.clock.now();
        if let Some(g) = granted.get(&ttl_s)
            && now < g.usable_until
        {
            return Ok(g.id);
        }
        let asked = ttl_s.saturating_add(ttl_s / 2).saturating_add(2);
        let reply = client
            .lease_grant(i64::try_from(asked).unwrap_or(i64::MAX))
            .await?;
        // etcd may grant longer than asked (its minimum TTL), never shorter.
        let got = u64::try_from(reply.ttl).unwrap_or(0).max(asked);
        let slack = got.saturating_sub(ttl_s).saturating_sub(1);
        let usable_until = now.saturating_add(slack.saturating_mul(1_000_000_000));
        granted.insert(
            ttl_s,
            Granted {
                id: reply.id,
                usable_until,
            },
        );
        Ok(reply.id)
    }

    /// Forgets every lease (etcd said one is gone: it expired while the store was cut off).
    pub(crate) async fn forget(&self) {
        self.granted.lock().await.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_counters_are_swept_once_the_map_doubles() {
        let owned = Owned::default();
        for i in 0..MIN_SWEEP as u64 {
            let own = Own {
                value: i,
                revision: 1,
                expires_at: 10,
            };
            owned.set(i.to_be_bytes().to_vec(), own, 5);
        }
        assert_eq!(owned.len(), MIN_SWEEP);
        let live = Own {
            value: 1,
            revision: 2,
            expires_at: 1_000,
        };
        owned.set(b"live".to_vec(), live, 500);
        assert_eq!(owned.len(), 1);
        assert_eq!(owned.get(b"live"), Some(live));
    }
}
