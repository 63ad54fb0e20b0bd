//! Who is being limited: per rule, its decisions so far and its heaviest keys, in fixed memory
//! whatever the key spray. The heavy hitters are a space-saving sketch (Metwally et al.) of
//! [`HEAVY_SLOTS`] keys; its counts halve every minute, so a key that stopped sending leaves the
//! list. A rule deciding under [`EXACT_BELOW_PER_SECOND`] requests a second feeds it every
//! request (its counts are exact); a busier one, one request in [`HEAVY_SAMPLE`] (a random draw
//! per thread), weighted by it. Recording never waits: a request that finds the sketch busy is
//! not recorded. A key whose counts came from a sample, took over a slot, or may have missed a
//! request is marked as an estimate.

use std::sync::atomic::{AtomicU64, Ordering};

use ecow::EcoString;
use parking_lot::Mutex;
use sluice_core::Nanos;

use crate::verdict::Outcome;

/// Keys a rule's sketch holds.
pub const HEAVY_SLOTS: usize = 32;
/// One request in this many (per thread) feeds the sketch, weighted by it.
pub const HEAVY_SAMPLE: u32 = 8;
/// Below this many decisions a second, a rule's sketch sees every request.
pub const EXACT_BELOW_PER_SECOND: u64 = 1_000;
/// The sketch's counts halve this often.
const HALF_LIFE_NS: Nanos = 60_000_000_000;

/// One key in the sketch: its estimated requests and denials (decayed), and how much of the
/// count may belong to keys it replaced.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    pub key: EcoString,
    pub requests: u64,
    pub denied: u64,
    pub error: u64,
    /// Whether the counts are an estimate (see the module's notes), not every request.
    pub estimated: bool,
}

#[derive(Debug, Default)]
struct Sketch {
    slots: Vec<Slot>,
    decayed_at: Nanos,
    /// When the rule's decision rate was last measured, and its decision total then.
    rate_at: Nanos,
    decisions_at: u64,
}

impl Sketch {
    /// Records one request of `key`, standing for `weight` requests (1: not sampled).
    fn observe(&mut self, key: &str, denied: bool, now: Nanos, weight: u32) {
        if now.saturating_sub(self.decayed_at) >= HALF_LIFE_NS {
            self.decayed_at = now;
            for s in &mut self.slots {
                s.requests /= 2;
                s.denied /= 2;
                s.error /= 2;
            }
            self.slots.retain(|s| s.requests > 0);
        }
        let sampled = weight > 1;
        let weight = u64::from(weight);
        let denied = if denied { weight } else { 0 };
        if let Some(s) = self.slots.iter_mut().find(|s| s.key == key) {
            s.requests += weight;
            s.denied += denied;
            s.estimated |= sampled;
        } else if self.slots.len() < HEAVY_SLOTS {
            self.slots.push(Slot {
                key: key.into(),
                requests: weight,
                denied,
                error: 0,
                estimated: sampled,
            });
        } else if let Some(min) = self.slots.iter_mut().min_by_key(|s| s.requests) {
            // Space-saving: the newcomer takes the smallest slot's place and count.
            *min = Slot {
                key: key.into(),
                requests: min.requests + weight,
                denied,
                error: min.requests,
                estimated: true,
            };
        }
    }
}

/// A rule's decisions and heaviest keys.
#[derive(Debug, Default)]
pub(crate) struct RuleStats {
    allowed: AtomicU64,
    denied: AtomicU64,
    shadow_denied: AtomicU64,
    heavy: Mutex<Sketch>,
    /// One request in this many feeds the sketch: 1 while the rule is quiet enough to count
    /// every request, [`HEAVY_SAMPLE`] above [`EXACT_BELOW_PER_SECOND`].
    sample_every: std::sync::atomic::AtomicU32,
    /// Requests that found the sketch busy and were not recorded, since it last had the lock.
    missed: AtomicU64,
}

/// A rule's decision totals since it was loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DecisionCounts {
    /// Allowed (unlimited rules' requests included).
    pub allowed: u64,
    /// Denied by this rule (an enforcing denial).
    pub denied: u64,
    /// Would have been denied by this rule in shadow mode.
    pub shadow_denied: u64,
}

impl RuleStats {
    /// Counts one decision of the rule.
    pub(crate) fn count(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Allowed | Outcome::Unlimited => &self.allowed,
            Outcome::ShadowDenied => &self.shadow_denied,
            Outcome::Denied | Outcome::CostExceedsLimit | Outcome::QuotaExceeded => &self.denied,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Feeds the sketch with one request for `key`, when this thread's turn comes.
    pub(crate) fn observe(&self, key: &str, denied: bool, now: Nanos) {
        let every = self.sample_every.load(Ordering::Relaxed).max(1);
        if every > 1 && !Self::my_turn(every) {
            return;
        }
        let Some(mut sketch) = self.heavy.try_lock() else {
            self.missed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if self.missed.swap(0, Ordering::Relaxed) > 0 {
            // Some request went unrecorded: no key's count can be trusted to be whole.
            for slot in &mut sketch.slots {
                slot.estimated = true;
            }
        }
        sketch.observe(key, denied, now, every);
        let total = || {
            let c = self.counts();
            c.allowed + c.denied + c.shadow_denied
        };
        if sketch.rate_at == 0 {
            (sketch.rate_at, sketch.decisions_at) = (now.max(1), total());
        } else if now.saturating_sub(sketch.rate_at) >= 1_000_000_000 {
            let total = total();
            let per_second = (total - sketch.decisions_at.min(total)) * 1_000_000_000
                / now.saturating_sub(sketch.rate_at).max(1);
            let every = if per_second >= EXACT_BELOW_PER_SECOND {
                HEAVY_SAMPLE
            } else {
                1
            };
            self.sample_every.store(every, Ordering::Relaxed);
            (sketch.rate_at, sketch.decisions_at) = (now, total);
        }
    }

    /// A random draw of one in `every`, not every n-th call: a request checks several rules
    /// in a row, and a counter shared by the thread would give every turn to the same one.
    fn my_turn(every: u32) -> bool {
        thread_local! {
            static STATE: std::cell::Cell<u64> = std::cell::Cell::new({
                let local = 0u8;
                (&raw const local as u64) | 1
            });
        }
        STATE.with(|state| {
            // xorshift64
            let mut x = state.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            state.set(x);
            x % u64::from(every) == 0
        })
    }

    pub(crate) fn counts(&self) -> DecisionCounts {
        DecisionCounts {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            shadow_denied: self.shadow_denied.load(Ordering::Relaxed),
        }
    }

    /// The `n` heaviest keys, heaviest first.
    pub(crate) fn heaviest(&self, n: usize) -> Vec<Slot> {
        let mut slots = self.heavy.lock().slots.clone();
        slots.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.key.cmp(&b.key)));
        slots.truncate(n);
        slots
    }
}

/// A key as a person reads it: the descriptor values, `/` between them (a key is stored as
/// `len:value` per value; a digest stands for a key too long to keep and is shown as is).
pub fn display_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut rest = key;
    while !rest.is_empty() {
        let parsed = rest.split_once(':').and_then(|(len, tail)| {
            let len: usize = len.parse().ok()?;
            tail.get(..len).map(|v| (v, &tail[len..]))
        });
        let Some((value, tail)) = parsed else {
            return key.to_owned();
        };
        if !out.is_empty() {
            out.push_str(" / ");
        }
        out.push_str(value);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(sketch: &mut Sketch, key: &str, times: usize, denied: bool, now: Nanos) {
        for _ in 0..times {
            sketch.observe(key, denied, now, HEAVY_SAMPLE);
        }
    }

    #[test]
    fn the_heavy_keys_stay_in_a_spray_of_single_requests() {
        let mut sketch = Sketch::default();
        for i in 0..10_000 {
            feed(&mut sketch, "heavy", 1, true, 1);
            feed(&mut sketch, &format!("spray-{i}"), 1, false, 1);
        }
        assert_eq!(sketch.slots.len(), HEAVY_SLOTS, "bounded");
        let heavy = sketch
            .slots
            .iter()
            .find(|s| s.key == "heavy")
            .expect("kept");
        assert_eq!(heavy.requests, 10_000 * u64::from(HEAVY_SAMPLE));
        assert_eq!(heavy.denied, heavy.requests);
        let top = sketch.slots.iter().max_by_key(|s| s.requests).unwrap();
        assert_eq!(top.key, "heavy");
    }

    #[test]
    fn counts_halve_each_minute_and_quiet_keys_leave() {
        let mut sketch = Sketch::default();
        feed(&mut sketch, "a", 4, false, 1);
        feed(&mut sketch, "b", 1, false, 1);
        feed(&mut sketch, "a", 0, false, HALF_LIFE_NS + 1);
        sketch.observe("c", false, HALF_LIFE_NS + 1, HEAVY_SAMPLE);
        let a = sketch.slots.iter().find(|s| s.key == "a").unwrap();
        assert_eq!(a.requests, 2 * u64::from(HEAVY_SAMPLE));
        for minute in 2..8 {
            sketch.observe("c", false, minute * HALF_LIFE_NS + 2, HEAVY_SAMPLE);
        }
        assert!(
            sketch.slots.iter().all(|s| s.key == "c"),
            "{:?}",
            sketch.slots
        );
    }

    #[test]
    fn a_quiet_rule_counts_every_request_and_a_busy_one_samples_and_says_so() {
        let stats = RuleStats::default();
        // 5 requests, 2 of them denied: exact.
        for denied in [false, false, false, true, true] {
            stats.count(if denied {
                Outcome::Denied
            } else {
                Outcome::Allowed
            });
            stats.observe("alice", denied, 1);
        }
        let alice = &stats.heaviest(1)[0];
        assert_eq!(
            (alice.requests, alice.denied, alice.estimated),
            (5, 2, false)
        );
        // A second later at 5,000 decisions a second: sampled from then on, and marked.
        for _ in 0..5_000 {
            stats.count(Outcome::Allowed);
        }
        stats.observe("bob", false, 1_000_000_002);
        assert_eq!(stats.sample_every.load(Ordering::Relaxed), HEAVY_SAMPLE);
        for _ in 0..800 {
            stats.observe("bob", false, 1_000_000_003);
        }
        let bob = stats
            .heaviest(2)
            .into_iter()
            .find(|s| s.key == "bob")
            .unwrap();
        assert!(bob.estimated, "{bob:?}");
        assert!(
            !stats
                .heaviest(2)
                .iter()
                .find(|s| s.key == "alice")
                .unwrap()
                .estimated
        );
    }

    #[test]
    fn keys_read_as_their_values() {
        assert_eq!(display_key("5:alice"), "alice");
        assert_eq!(display_key("3:GET4:/a:b"), "GET / /a:b");
        assert_eq!(display_key("sha256:abc"), "sha256:abc");
        assert_eq!(display_key("9:short"), "9:short");
        assert_eq!(display_key(""), "");
    }
}
