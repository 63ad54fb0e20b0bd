//! A fixed-memory count-min sketch per rule for keys beyond the rule's cap (docs/RELIABILITY.md),
//! in the manner of pingora-limits: counts per window, never grows.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use sluice_core::Nanos;

const DEPTH: usize = 4;
const WIDTH: usize = 1 << 14;

/// Over-estimating counts of untracked keys in the current window.
pub(crate) struct OverflowSketch {
    window: AtomicU64,
    counters: Box<[AtomicU32]>,
    seeds: [u64; DEPTH],
}

impl OverflowSketch {
    pub(crate) fn new() -> Self {
        Self {
            window: AtomicU64::new(0),
            counters: (0..DEPTH * WIDTH).map(|_| AtomicU32::new(0)).collect(),
            // Per-process random seeds (std's hasher keys come from the OS): an attacker who
            // knows the code still cannot pick keys that share cells with a victim's.
            seeds: std::array::from_fn(|row| {
                use std::hash::BuildHasher as _;
                std::collections::hash_map::RandomState::new().hash_one(row) | 1
            }),
        }
    }

    fn slots(&self, key: &str) -> [usize; DEPTH] {
        let mut out = [0; DEPTH];
        for (row, seed) in self.seeds.iter().enumerate() {
            let mut h = *seed;
            for b in key.as_bytes() {
                h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            h ^= h >> 29;
            out[row] = row * WIDTH + (h as usize % WIDTH);
        }
        out
    }

    /// Admits `cost` for `key` if its estimated count in the window stays within `limit`.
    /// The estimate never undercounts, so a key is never admitted beyond its limit; keys that
    /// share cells with heavy keys may be denied early (the price of bounded memory).
    pub(crate) fn check(
        &self,
        key: &str,
        now: Nanos,
        window_ns: u64,
        limit: u64,
        cost: u64,
    ) -> bool {
        let w = now / window_ns;
        let seen = self.window.load(Ordering::Relaxed);
        if w > seen
            && self
                .window
                .compare_exchange(seen, w, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            for c in self.counters.iter() {
                c.store(0, Ordering::Relaxed);
            }
        }
        let slots = self.slots(key);
        let estimate = slots
            .iter()
            .map(|&i| u64::from(self.counters[i].load(Ordering::Relaxed)))
            .min()
            .unwrap_or(0);
        if estimate.saturating_add(cost) > limit {
            return false;
        }
        // Saturating: a counter that wrapped would admit its keys again.
        let add = u32::try_from(cost).unwrap_or(u32::MAX);
        for i in slots {
            let _ = self.counters[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_add(add))
            });
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_cost_never_wraps_a_counter() {
        let sketch = OverflowSketch::new();
        let w = 1_000_000_000;
        assert!(sketch.check("k", 0, w, 5, 5));
        assert!(!sketch.check("k", 0, w, 5, 1), "the key is at its limit");
        assert!(
            !sketch.check("k", 0, w, 5, u64::MAX),
            "no overflow past the limit"
        );
        assert!(sketch.check("big", 0, w, u64::MAX, u64::from(u32::MAX)));
        assert!(sketch.check("big", 0, w, u64::MAX, u64::from(u32::MAX)));
        let slots = sketch.slots("big");
        assert!(
            slots
                .iter()
                .all(|&i| sketch.counters[i].load(Ordering::Relaxed) == u32::MAX),
            "counters saturate instead of wrapping"
        );
        assert!(!sketch.check("k", 0, w, 5, 1), "still denied");
    }

    #[test]
    fn seeds_are_not_public_constants() {
        // Random per sketch: the cells a key maps to cannot be worked out from the code.
        assert_ne!(OverflowSketch::new().seeds, OverflowSketch::new().seeds);
    }
}
