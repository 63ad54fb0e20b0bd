//! A fixed-memory count-min sketch per rule for keys beyond the rule's cap (docs/RELIABILITY.md),
//! in the manner of pingora-limits: counts per window, never grows.
//!
//! A plain count-min estimate (the smallest of a key's cells) never undercounts, but a spray
//! of distinct keys raises every cell: once the cells hold about the limit, every new key is
//! refused. So the estimate is count-mean-min's: from each of the key's cells the row's noise
//! floor is taken away (what the other keys put in an average cell: the row's total, which is
//! the sketch's admitted cost, spread over the row's other cells), and the smallest of those is
//! the key's count. That was the smallest row's; it is now the median of the key's rows, and a
//! key is refused once that estimate, less a margin of 1.25 standard deviations of the noise
//! (`sqrt(sum of squared costs / width)`; `sqrt(floor)` when each cost is 1), would pass its
//! limit. A heavy key is thus admitted at most about its limit plus 4.5 standard deviations
//! (see [`OverflowSketch::excess_bound`]); without a spray the floor is 0 and the estimate is
//! the plain count-min one. A fixed multiple of the limit is out of reach: a key's only trace
//! is its cells, whose noise varies by a deviation (28 after 500,000 keys at cost 5) that
//! dwarfs a small limit, so telling a key 2 x its limit deep from a new user takes per-key
//! state.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use sluice_core::Nanos;

const DEPTH: usize = 4;
const WIDTH: usize = 1 << 14;
/// The margin taken off a key's estimate, in standard deviations of a cell's noise: about
/// 2.3 deviations of the median of four rows, so a new user (all noise) is refused about once
/// in 200 at worst (a limit near 0 and a deep spray).
const MARGIN_DEVIATIONS: f64 = 1.25;
/// How far past its limit a key in the sketch is admitted at most, in the same deviations: the
/// margin plus five deviations of the median of four rows (about 0.6 of a cell's each).
#[cfg(test)]
const EXCESS_DEVIATIONS: f64 = 4.5;

/// What a check of the sketch found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SketchCheck {
    /// Whether the cost was admitted (and counted).
    pub admitted: bool,
    /// Units of the limit left for the key after this check (an estimate).
    pub remaining: u64,
}

/// Over-estimating counts of untracked keys in the current window.
pub(crate) struct OverflowSketch {
    window: AtomicU64,
    counters: Box<[AtomicU32]>,
    /// The cost admitted in the window: every row's total.
    admitted: AtomicU64,
    /// The sum of the squares of the costs admitted in the window (saturating): the noise a
    /// cell holds varies by this over the width, whatever the costs.
    admitted_sq: AtomicU64,
    seeds: [u64; DEPTH],
}

impl OverflowSketch {
    pub(crate) fn new() -> Self {
        Self {
            window: AtomicU64::new(0),
            counters: (0..DEPTH * WIDTH).map(|_| AtomicU32::new(0)).collect(),
            admitted: AtomicU64::new(0),
            admitted_sq: AtomicU64::new(0),
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

    /// The average count other keys put in a cell this window (the noise floor).
    pub(crate) fn noise_floor(&self) -> f64 {
        self.admitted.load(Ordering::Relaxed) as f64 / WIDTH as f64
    }

    /// How far beyond its limit a key in the sketch may be admitted in a window, with
    /// overwhelming probability (the margin, plus a deviation of the median of the key's rows
    /// of at most five of its standard deviations): 4.5 standard deviations of a cell's noise,
    /// rounded up (`4.5 * sqrt(noise floor)` when each cost is 1). 0 without other keys'
    /// counts; 50 after a spray of 2,000,000 keys at one request each; 125 after 500,000 keys
    /// at cost 5.
    #[cfg(test)]
    pub(crate) fn excess_bound(&self) -> u64 {
        (EXCESS_DEVIATIONS * self.noise_deviation()).ceil() as u64
    }

    /// The standard deviation of the noise in a cell: `sqrt(sum of squared costs / width)`,
    /// which is `sqrt(noise floor)` when every cost is 1.
    fn noise_deviation(&self) -> f64 {
        (self.admitted_sq.load(Ordering::Relaxed) as f64 / WIDTH as f64).sqrt()
    }

    /// The key's estimated count: the median over its rows of its cell less the row's noise
    /// floor, less a margin of [`MARGIN_DEVIATIONS`] standard deviations of the noise, never
    /// above the plain count-min estimate. The median of four rows varies by about half a
    /// cell's deviation, where the smallest of four sits about one deviation below the floor:
    /// the smallest let a heavy key's own count hide in its quietest row. A saturated cell is
    /// no measure of its keys: its row is left out (all saturated: the count-min estimate).
    fn estimate(&self, slots: &[usize; DEPTH]) -> u64 {
        let total = self.admitted.load(Ordering::Relaxed);
        let margin = MARGIN_DEVIATIONS * self.noise_deviation();
        let mut count_min = u64::MAX;
        let mut debiased = [0.0f64; DEPTH];
        let mut rows = 0;
        for &i in slots {
            let cell = self.counters[i].load(Ordering::Relaxed);
            count_min = count_min.min(u64::from(cell));
            if cell == u32::MAX {
                continue;
            }
            let others = total.saturating_sub(u64::from(cell));
            let floor = others as f64 / (WIDTH - 1) as f64;
            debiased[rows] = f64::from(cell) - floor;
            rows += 1;
        }
        if rows == 0 {
            return count_min;
        }
        let debiased = &mut debiased[..rows];
        debiased.sort_by(f64::total_cmp);
        let median = if rows % 2 == 0 {
            (debiased[rows / 2 - 1] + debiased[rows / 2]) / 2.0
        } else {
            debiased[rows / 2]
        };
        // Rounded up, and at least 0: the cast saturates.
        ((median - margin).ceil().max(0.0) as u64).min(count_min)
    }

    /// Admits `cost` for `key` if its estimated count in the window stays within `limit`.
    /// Keys whose cells hold no more than the other keys' noise are admitted; a key is
    /// admitted at most [`OverflowSketch::excess_bound`] beyond its limit.
    pub(crate) fn check(
        &self,
        key: &str,
        now: Nanos,
        window_ns: u64,
        limit: u64,
        cost: u64,
    ) -> SketchCheck {
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
            self.admitted.store(0, Ordering::Relaxed);
            self.admitted_sq.store(0, Ordering::Relaxed);
        }
        let slots = self.slots(key);
        let estimate = self.estimate(&slots);
        let after = estimate.saturating_add(cost);
        if after > limit {
            let remaining = limit.saturating_sub(estimate);
            return SketchCheck {
                admitted: false,
                remaining,
            };
        }
        if cost > 0 {
            // Saturating: a counter that wrapped would admit its keys again.
            let add = u32::try_from(cost).unwrap_or(u32::MAX);
            for i in slots {
                let _ = self.counters[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                    Some(c.saturating_add(add))
                });
            }
            self.admitted.fetch_add(cost, Ordering::Relaxed);
            let square = cost.saturating_mul(cost);
            let _ = self
                .admitted_sq
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                    Some(s.saturating_add(square))
                });
        }
        SketchCheck {
            admitted: true,
            remaining: limit - after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 1_000_000_000;

    #[test]
    fn a_huge_cost_never_wraps_a_counter() {
        let sketch = OverflowSketch::new();
        assert!(sketch.check("k", 0, W, 5, 5).admitted);
        assert!(!sketch.check("k", 0, W, 5, 1).admitted, "at its limit");
        assert!(
            !sketch.check("k", 0, W, 5, u64::MAX).admitted,
            "no overflow past the limit"
        );
        assert!(
            sketch
                .check("big", 0, W, u64::MAX, u64::from(u32::MAX))
                .admitted
        );
        assert!(
            sketch
                .check("big", 0, W, u64::MAX, u64::from(u32::MAX))
                .admitted
        );
        let slots = sketch.slots("big");
        assert!(
            slots
                .iter()
                .all(|&i| sketch.counters[i].load(Ordering::Relaxed) == u32::MAX),
            "counters saturate instead of wrapping"
        );
        assert_eq!(sketch.estimate(&slots), u64::from(u32::MAX));
        assert!(
            !sketch.check("big", 0, W, u64::from(u32::MAX), 1).admitted,
            "a saturated key stays at its count"
        );
    }

    #[test]
    fn seeds_are_not_public_constants() {
        // Random per sketch: the cells a key maps to cannot be worked out from the code.
        assert_ne!(OverflowSketch::new().seeds, OverflowSketch::new().seeds);
    }

    #[test]
    fn without_other_keys_the_estimate_is_exact_and_a_look_counts_nothing() {
        let sketch = OverflowSketch::new();
        for n in 0..5 {
            let c = sketch.check("k", 0, W, 5, 1);
            assert_eq!((c.admitted, c.remaining), (true, 4 - n));
        }
        assert_eq!(
            sketch.check("k", 0, W, 5, 0),
            SketchCheck {
                admitted: true,
                remaining: 0
            }
        );
        assert!(!sketch.check("k", 0, W, 5, 1).admitted);
        assert_eq!(sketch.excess_bound(), 1, "5 units in 16,384 cells");
        assert!(sketch.noise_floor() < 0.001);
        // A new window starts over.
        assert!(sketch.check("k", W, W, 5, 1).admitted);
    }
}
