//! Who is being limited: per rule, its decisions so far and its heaviest keys, in fixed memory
//! whatever the key spray. The heavy hitters are a space-saving sketch (Metwally et al.) of
//! [`HEAVY_SLOTS`] keys fed by one request in [`HEAVY_SAMPLE`] (a random draw per thread); its counts halve
//! every minute, so a key that stopped sending leaves the list. Recording never waits: a
//! request that finds the sketch busy is not sampled.

use std::sync::atomic::{AtomicU64, Ordering};

use ecow::EcoString;
use parking_lot::Mutex;
use sluice_core::Nanos;

use crate::verdict::Outcome;

/// Keys a rule's sketch holds.
pub const HEAVY_SLOTS: usize = 32;
/// One request in this many (per thread) feeds the sketch, weighted by it.
pub const HEAVY_SAMPLE: u32 = 8;
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
}

#[derive(Debug, Default)]
struct Sketch {
    slots: Vec<Slot>,
    decayed_at: Nanos,
}

impl Sketch {
    fn observe(&mut self, key: &str, denied: bool, now: Nanos) {
        if now.saturating_sub(self.decayed_at) >= HALF_LIFE_NS {
            self.decayed_at = now;
            for s in &mut self.slots {
                s.requests /= 2;
                s.denied /= 2;
                s.error /= 2;
            }
            self.slots.retain(|s| s.requests > 0);
        }
        let weight = u64::from(HEAVY_SAMPLE);
        let denied = if denied { weight } else { 0 };
        if let Some(s) = self.slots.iter_mut().find(|s| s.key == key) {
            s.requests += weight;
            s.denied += denied;
        } else if self.slots.len() < HEAVY_SLOTS {
            self.slots.push(Slot {
                key: key.into(),
                requests: weight,
                denied,
                error: 0,
            });
        } else if let Some(min) = self.slots.iter_mut().min_by_key(|s| s.requests) {
            // Space-saving: the newcomer takes the smallest slot's place and count.
            *min = Slot {
                key: key.into(),
                requests: min.requests + weight,
                denied,
                error: min.requests,
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
        // A random draw, not every n-th call: a request checks several rules in a row, and
        // a counter shared by the thread would give every turn to the same one.
        thread_local! {
            static STATE: std::cell::Cell<u64> = std::cell::Cell::new({
                let local = 0u8;
                (&raw const local as u64) | 1
            });
        }
        let turn = STATE.with(|state| {
            // xorshift64
            let mut x = state.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            state.set(x);
            x % u64::from(HEAVY_SAMPLE) == 0
        });
        if turn && let Some(mut sketch) = self.heavy.try_lock() {
            sketch.observe(key, denied, now);
        }
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
            sketch.observe(key, denied, now);
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
        sketch.observe("c", false, HALF_LIFE_NS + 1);
        let a = sketch.slots.iter().find(|s| s.key == "a").unwrap();
        assert_eq!(a.requests, 2 * u64::from(HEAVY_SAMPLE));
        for minute in 2..8 {
            sketch.observe("c", false, minute * HALF_LIFE_NS + 2);
        }
        assert!(
            sketch.slots.iter().all(|s| s.key == "c"),
            "{:?}",
            sketch.slots
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
