//! Ad-hoc limits (`/v1/acquire` with `limit`): a keyed limiter per shape, and the key budget
//! all shapes share, so that a spray of keys and shapes cannot grow memory past it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_core::{Clock, CoarseClock, Gcra, KeyedLimiter, Nanos, Rate};

use crate::api::{AdhocLimit, WindowSpec};
use crate::error::RequestError;

/// Distinct ad-hoc limits (shapes) kept at once, each with its own keyed limiter; beyond it
/// the least recently used shape is dropped (its keys start over, as after a restart).
pub(crate) const MAX_ADHOC_SHAPES: usize = 1_000;
/// Keys of one ad-hoc shape kept at once; past it (or past the budget of all shapes,
/// `api.adhoc_max_keys`) idle keys are swept, and while it is still full a new key is denied.
pub(crate) const MAX_ADHOC_KEYS: usize = 100_000;
/// New keys admitted between two counts of every shape's keys (the count in between only
/// grows, so the budget is never passed by more than the requests in flight).
const RECOUNT_EVERY: usize = 1024;
/// The most often idle keys are swept when a cap is reached: a sweep walks every key, and a
/// spray must not make each request pay for one.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

type Shape = (u64, u64, u64);
pub(crate) type AdhocLimiter = KeyedLimiter<String, Gcra, CoarseClock>;

/// Whether a key may be kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyAdmission {
    /// Known already, or there is room for it.
    Kept,
    /// Its shape holds [`MAX_ADHOC_KEYS`] keys that are not idle.
    ShapeFull,
    /// All shapes hold the budget (`api.adhoc_max_keys`) of keys that are not idle.
    BudgetSpent,
}

/// The ad-hoc limiters by shape, and the key count of all of them.
pub(crate) struct AdhocLimits {
    clock: CoarseClock,
    shapes: Mutex<Shapes>,
}

#[derive(Default)]
struct Shapes {
    by_shape: HashMap<Shape, (Arc<AdhocLimiter>, u64)>,
    /// Use counter, for least-recently-used eviction.
    tick: u64,
    /// Keys of every shape at the last count.
    counted: usize,
    /// New keys admitted since.
    since: usize,
    /// When idle keys were last swept (`None`: never).
    swept_at: Option<Nanos>,
}

impl Shapes {
    fn recount(&mut self) {
        self.counted = self.by_shape.values().map(|(l, _)| l.len()).sum();
        self.since = 0;
        metrics::gauge!("sluice_adhoc_keys").set(self.counted as f64);
    }

    fn keys(&self) -> usize {
        self.counted.saturating_add(self.since)
    }

    /// Whether a sweep may start at `now` (and if so, marks it started).
    fn sweep_due(&mut self, now: Nanos) -> bool {
        let every = sluice_core::duration_to_nanos(SWEEP_EVERY);
        let due = self
            .swept_at
            .is_none_or(|at| now.saturating_sub(at) >= every);
        if due {
            self.swept_at = Some(now);
        }
        due
    }
}

impl AdhocLimits {
    pub(crate) fn new() -> Self {
        Self {
            clock: CoarseClock::new(),
            shapes: Mutex::new(Shapes::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shapes> {
        self.shapes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The limiter of `limit`'s shape, made (and the least recently used shape dropped) when
    /// it is new.
    pub(crate) fn limiter(&self, limit: &AdhocLimit) -> Result<Arc<AdhocLimiter>, RequestError> {
        if let Some(a) = &limit.algorithm
            && a != "token_bucket"
        {
            return Err(RequestError::invalid(format!(
                "limit.algorithm `{a}` is not supported here; write `token_bucket` or leave it out"
            )));
        }
        let window = match &limit.window {
            WindowSpec::Seconds(s) => Duration::from_secs(*s),
            WindowSpec::Text(t) => parse_window(t).ok_or_else(|| {
                RequestError::invalid(format!(
                    "limit.window `{t}` is not a duration; write e.g. \"1m\", \"90s\" or 60"
                ))
            })?,
        };
        let rate = Rate::new(limit.requests, window)
            .map_err(|e| RequestError::invalid(format!("limit: {e}")))?;
        let burst = limit.burst.unwrap_or(limit.requests);
        if burst == 0 {
            return Err(RequestError::invalid("limit.burst must be at least 1"));
        }
        let shape = (rate.limit(), rate.window_ns(), burst);
        let mut shapes = self.lock();
        shapes.tick += 1;
        let tick = shapes.tick;
        if let Some((l, used)) = shapes.by_shape.get_mut(&shape) {
            *used = tick;
            return Ok(l.clone());
        }
        if shapes.by_shape.len() >= MAX_ADHOC_SHAPES
            && let Some(oldest) = shapes
                .by_shape
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(s, _)| *s)
        {
            shapes.by_shape.remove(&oldest);
            shapes.recount();
            metrics::counter!("sluice_adhoc_shapes_evicted_total").increment(1);
        }
        let limiter = Arc::new(KeyedLimiter::with_clock(
            Gcra::with_burst(rate, burst),
            self.clock.clone(),
        ));
        shapes.by_shape.insert(shape, (limiter.clone(), tick));
        Ok(limiter)
    }

    /// Whether `key` of `limiter`'s shape may be kept: known keys always; a new one while its
    /// shape and the budget of all shapes (`max_keys`) have room, after a sweep of idle keys
    /// (at most once a second) when they have not. Refusals count in
    /// `sluice_adhoc_keys_refused_total`.
    pub(crate) fn admit_key(
        &self,
        limiter: &AdhocLimiter,
        key: &str,
        max_keys: usize,
    ) -> KeyAdmission {
        if limiter.contains(key) {
            return KeyAdmission::Kept;
        }
        let admission = self.admit_new_key(limiter, max_keys);
        if admission != KeyAdmission::Kept {
            metrics::counter!("sluice_adhoc_keys_refused_total").increment(1);
        }
        admission
    }

    fn admit_new_key(&self, limiter: &AdhocLimiter, max_keys: usize) -> KeyAdmission {
        let now = self.clock.now();
        let mut shapes = self.lock();
        if shapes.since >= RECOUNT_EVERY || shapes.keys() >= max_keys {
            shapes.recount();
        }
        let full = |shapes: &Shapes| {
            if limiter.len() >= MAX_ADHOC_KEYS {
                Some(KeyAdmission::ShapeFull)
            } else if shapes.keys() >= max_keys {
                Some(KeyAdmission::BudgetSpent)
            } else {
                None
            }
        };
        if full(&shapes).is_some() && shapes.sweep_due(now) {
            // Swept without the lock: a sweep walks every key.
            let limiters: Vec<Arc<AdhocLimiter>> =
                shapes.by_shape.values().map(|(l, _)| l.clone()).collect();
            drop(shapes);
            for l in &limiters {
                l.evict_idle(now);
            }
            shapes = self.lock();
            shapes.recount();
        }
        if let Some(refused) = full(&shapes) {
            return refused;
        }
        shapes.since += 1;
        KeyAdmission::Kept
    }

    /// Shapes kept (tests).
    #[cfg(test)]
    pub(crate) fn shapes(&self) -> Vec<Shape> {
        self.lock().by_shape.keys().copied().collect()
    }
}

fn parse_window(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let n: u64 = text[..split].parse().ok()?;
    let unit = match &text[split..] {
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86_400),
        _ => return None,
    };
    unit.checked_mul(u32::try_from(n).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(requests: u64) -> AdhocLimit {
        AdhocLimit {
            requests,
            window: WindowSpec::Seconds(3600),
            burst: None,
            algorithm: None,
        }
    }

    #[test]
    fn a_spray_of_shapes_keeps_the_newest_and_never_refuses() {
        let adhoc = AdhocLimits::new();
        let first = adhoc.limiter(&limit(1)).unwrap();
        for n in 2..=(MAX_ADHOC_SHAPES as u64 * 3) {
            adhoc.limiter(&limit(n)).unwrap();
            // The first shape is in use all along: LRU keeps it.
            if n % 100 == 0 {
                assert!(Arc::ptr_eq(&first, &adhoc.limiter(&limit(1)).unwrap()));
            }
        }
        let shapes = adhoc.shapes();
        assert_eq!(shapes.len(), MAX_ADHOC_SHAPES);
        assert!(shapes.contains(&(1, 3_600_000_000_000, 1)));
    }

    /// Keys sprayed over many shapes stop at the budget of all shapes together, not at the
    /// cap of each (1,000 shapes x 100,000 keys); known keys keep being served.
    #[test]
    fn keys_sprayed_over_many_shapes_stop_at_the_budget() {
        let adhoc = AdhocLimits::new();
        let budget = 5_000;
        let mut kept = 0;
        let mut refused = 0;
        for shape in 1..=50u64 {
            let limiter = adhoc.limiter(&limit(shape)).unwrap();
            for i in 0..1_000 {
                let key = format!("{shape}:{i}");
                match adhoc.admit_key(&limiter, &key, budget) {
                    KeyAdmission::Kept => {
                        assert!(limiter.check(key.as_str(), 1).is_allowed());
                        kept += 1;
                    }
                    KeyAdmission::BudgetSpent => refused += 1,
                    KeyAdmission::ShapeFull => panic!("no shape is full"),
                }
            }
        }
        assert_eq!((kept, refused), (budget, 50_000 - budget));
        let total: usize = adhoc.lock().by_shape.values().map(|(l, _)| l.len()).sum();
        assert_eq!(total, budget);
        // A known key is still served at the budget.
        let limiter = adhoc.limiter(&limit(1)).unwrap();
        assert_eq!(adhoc.admit_key(&limiter, "1:0", budget), KeyAdmission::Kept);
    }
}
