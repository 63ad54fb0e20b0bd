//! The order in which one ad-hoc shape's keys arrived, so that a full budget evicts the oldest
//! key instead of refusing a new one.

use std::collections::{HashSet, VecDeque};

use sluice_core::{CoarseClock, Gcra, KeyedLimiter};

/// One ad-hoc shape's keyed limiter.
pub(crate) type AdhocLimiter = KeyedLimiter<String, Gcra, CoarseClock>;

/// Keys of one shape, oldest first. An entry can outlive its key (swept idle, or never stored
/// because its first acquire could never fit); such entries are skipped when met and dropped
/// by [`Arrivals::compact`], which runs whenever they could outnumber the live keys.
#[derive(Default)]
pub(crate) struct Arrivals {
    keys: VecDeque<String>,
}

/// Entries beyond the live keys tolerated before a compaction.
const SLACK: usize = 1024;

impl Arrivals {
    /// Records a new key of `limiter`, compacting first when stale entries pile up.
    pub(crate) fn push(&mut self, key: &str, limiter: &AdhocLimiter) {
        if self.keys.len() >= limiter.len().saturating_mul(2).saturating_add(SLACK) {
            self.compact(limiter);
        }
        self.keys.push_back(key.to_owned());
    }

    /// Forgets the oldest key still held by `limiter`; whether one was.
    pub(crate) fn evict_oldest(&mut self, limiter: &AdhocLimiter) -> bool {
        while let Some(key) = self.keys.pop_front() {
            if limiter.remove(key.as_str()) {
                return true;
            }
        }
        false
    }

    /// Drops entries whose key `limiter` no longer holds, and repeats of a key (its first
    /// arrival stays).
    pub(crate) fn compact(&mut self, limiter: &AdhocLimiter) {
        let mut seen = HashSet::with_capacity(self.keys.len());
        self.keys
            .retain(|k| limiter.contains(k.as_str()) && seen.insert(k.clone()));
    }

    /// Entries kept (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}
