//! Ad-hoc limits (`/v1/acquire` with `limit`): a keyed limiter per shape, and the key budget
//! all shapes share, so that a spray of keys and shapes cannot grow memory past it. A full
//! budget evicts the oldest key of the largest shape rather than refusing a new one, so that a
//! spray cannot lock other callers out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_core::{Clock, CoarseClock, Gcra, KeyedLimiter, Nanos, Rate};

use crate::adhoc_arrivals::{AdhocLimiter, Arrivals};
use crate::error::RequestError;

/// Distinct ad-hoc limits (shapes) kept at once, each with its own keyed limiter; beyond it
/// the least recently used shape is dropped (its keys start over, as after a restart).
pub(crate) const MAX_ADHOC_SHAPES: usize = 1_000;
/// Keys of one ad-hoc shape kept at once; past it a new key of the shape evicts the shape's
/// oldest key.
pub(crate) const MAX_ADHOC_KEYS: usize = 100_000;
/// The longest ad-hoc window: a key holds budget for up to its window, and a longer limit
/// belongs in a rule (`api.domain`), whose keys do not take ad-hoc budget.
pub(crate) const MAX_ADHOC_WINDOW: Duration = Duration::from_secs(86_400);
/// New keys admitted between two counts of every shape's keys (the count in between only
/// grows, so the budget is never passed by more than the requests in flight).
const RECOUNT_EVERY: usize = 1024;
/// The most often idle keys are swept when a cap is reached: a sweep walks every key, and a
/// spray must not make each request pay for one.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

type Shape = (u64, u64, u64);

/// A limit sent with the request: a token bucket of `requests` per `window`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AdhocLimit {
    /// Tokens per window.
    pub requests: u64,
    /// Window: a duration such as `"1m"` or `"90s"`, or a number of seconds.
    pub window: WindowSpec,
    /// Bucket size (defaults to `requests`).
    #[serde(default)]
    pub burst: Option<u64>,
    /// Only `token_bucket` is accepted (the default).
    #[serde(default)]
    pub algorithm: Option<String>,
}

/// A window as text (`"1m"`) or seconds (`60`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum WindowSpec {
    /// Seconds.
    Seconds(u64),
    /// Text such as `90s`, `1m`, `1h30m`.
    Text(String),
}

// Read by hand rather than as an untagged enum: serde buffers an untagged value and tries
// each variant in turn, building an error for every miss (on `/v1/acquire`, a formatted
// error per request whose window is text).
impl<'de> Deserialize<'de> for WindowSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Window;
        impl serde::de::Visitor<'_> for Window {
            type Value = WindowSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration such as \"1m\" or \"90s\", or a number of seconds")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<WindowSpec, E> {
                Ok(WindowSpec::Seconds(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<WindowSpec, E> {
                u64::try_from(v)
                    .map(WindowSpec::Seconds)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<WindowSpec, E> {
                Ok(WindowSpec::Text(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<WindowSpec, E> {
                Ok(WindowSpec::Text(v))
            }
        }
        deserializer.deserialize_any(Window)
    }
}

/// One ad-hoc limit: its shape and its keyed limiter.
#[derive(Clone)]
pub(crate) struct AdhocShape {
    shape: Shape,
    limiter: Arc<AdhocLimiter>,
}

impl AdhocShape {
    pub(crate) fn limiter(&self) -> &AdhocLimiter {
        &self.limiter
    }
}

/// How a key was admitted (a key is never refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyAdmission {
    /// Known already.
    Known,
    /// New, and there was room for it.
    Added,
    /// New, in place of the oldest key of its own shape (the shape held
    /// [`MAX_ADHOC_KEYS`] keys) or of the largest shape (all shapes held the budget).
    Evicted,
}

/// The ad-hoc limiters by shape, and the key count of all of them.
pub(crate) struct AdhocLimits {
    clock: CoarseClock,
    shapes: Mutex<Shapes>,
}

struct ShapeEntry {
    limiter: Arc<AdhocLimiter>,
    /// Use tick, for least-recently-used eviction of shapes.
    used: u64,
    arrivals: Arrivals,
}

#[derive(Default)]
struct Shapes {
    by_shape: HashMap<Shape, ShapeEntry>,
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
        self.counted = self.by_shape.values().map(|e| e.limiter.len()).sum();
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

    /// Evicts the oldest key of `shape`; whether one was.
    fn evict_from(&mut self, shape: &Shape) -> bool {
        let Some(entry) = self.by_shape.get_mut(shape) else {
            return false;
        };
        let evicted = entry.arrivals.evict_oldest(&entry.limiter);
        if evicted {
            self.counted = self.counted.saturating_sub(1);
            metrics::counter!("sluice_adhoc_keys_evicted_total").increment(1);
        }
        evicted
    }

    /// The shape holding the most keys.
    fn largest(&self) -> Option<Shape> {
        self.by_shape
            .iter()
            .max_by_key(|(_, e)| e.limiter.len())
            .map(|(s, _)| *s)
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
    pub(crate) fn limiter(&self, limit: &AdhocLimit) -> Result<AdhocShape, RequestError> {
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
        if window > MAX_ADHOC_WINDOW {
            return Err(RequestError::invalid(format!(
                "limit.window is {}; ad-hoc limits allow at most 1d: declare a rule in the api domain for a longer window",
                sluice_core::format_duration(window)
            )));
        }
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
        if let Some(entry) = shapes.by_shape.get_mut(&shape) {
            entry.used = tick;
            return Ok(AdhocShape {
                shape,
                limiter: entry.limiter.clone(),
            });
        }
        if shapes.by_shape.len() >= MAX_ADHOC_SHAPES
            && let Some(oldest) = shapes
                .by_shape
                .iter()
                .min_by_key(|(_, e)| e.used)
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
        shapes.by_shape.insert(
            shape,
            ShapeEntry {
                limiter: limiter.clone(),
                used: tick,
                arrivals: Arrivals::default(),
            },
        );
        Ok(AdhocShape { shape, limiter })
    }

    /// Admits `key` of `shape`: known keys as they are; a new one while its shape and the
    /// budget of all shapes (`max_keys`) have room, after a sweep of idle keys (at most once a
    /// second) when they have not, and otherwise in place of the oldest key of its own shape
    /// (shape full) or of the largest shape (budget full). Evictions count in
    /// `sluice_adhoc_keys_evicted_total`.
    pub(crate) fn admit_key(&self, shape: &AdhocShape, key: &str, max_keys: usize) -> KeyAdmission {
        if shape.limiter.contains(key) {
            return KeyAdmission::Known;
        }
        let now = self.clock.now();
        let mut shapes = self.lock();
        if shapes.since >= RECOUNT_EVERY || shapes.keys() >= max_keys {
            shapes.recount();
        }
        let full =
            |shapes: &Shapes| shape.limiter.len() >= MAX_ADHOC_KEYS || shapes.keys() >= max_keys;
        if full(&shapes) && shapes.sweep_due(now) {
            // Swept without the lock: a sweep walks every key.
            let limiters: Vec<Arc<AdhocLimiter>> = shapes
                .by_shape
                .values()
                .map(|e| e.limiter.clone())
                .collect();
            drop(shapes);
            for l in &limiters {
                l.evict_idle(now);
            }
            shapes = self.lock();
            for entry in shapes.by_shape.values_mut() {
                entry.arrivals.compact(&entry.limiter);
            }
            shapes.recount();
        }
        let mut admission = KeyAdmission::Added;
        if shape.limiter.len() >= MAX_ADHOC_KEYS {
            if shapes.evict_from(&shape.shape) {
                admission = KeyAdmission::Evicted;
            }
        } else if shapes.keys() >= max_keys
            && let Some(largest) = shapes.largest()
            && shapes.evict_from(&largest)
        {
            admission = KeyAdmission::Evicted;
        }
        shapes.since += 1;
        if let Some(entry) = shapes.by_shape.get_mut(&shape.shape) {
            entry.arrivals.push(key, &entry.limiter);
        }
        admission
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
    fn a_window_is_read_as_seconds_or_as_text() {
        let read = |json: &str| serde_json::from_str::<WindowSpec>(json);
        assert_eq!(read("60").unwrap(), WindowSpec::Seconds(60));
        assert_eq!(read("\"1m\"").unwrap(), WindowSpec::Text("1m".into()));
        assert_eq!(read("\"1\\u0068\"").unwrap(), WindowSpec::Text("1h".into()));
        for bad in ["-1", "1.5", "true", "null", "[60]", "{}"] {
            let e = read(bad).unwrap_err().to_string();
            assert!(e.contains("a number of seconds"), "{bad}: {e}");
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
                assert!(Arc::ptr_eq(
                    &first.limiter,
                    &adhoc.limiter(&limit(1)).unwrap().limiter
                ));
            }
        }
        let shapes = adhoc.shapes();
        assert_eq!(shapes.len(), MAX_ADHOC_SHAPES);
        assert!(shapes.contains(&(1, 3_600_000_000_000, 1)));
    }

    /// Keys sprayed over many shapes stop at the budget of all shapes together, not at the
    /// cap of each (1,000 shapes x 100,000 keys): past it every new key evicts the oldest key
    /// of the largest shape, so new keys are served and memory stays at the budget.
    #[test]
    fn keys_sprayed_over_many_shapes_stop_at_the_budget() {
        let adhoc = AdhocLimits::new();
        let budget = 5_000;
        let mut evicted = 0;
        for shape in 1..=50u64 {
            let limiter = adhoc.limiter(&limit(shape)).unwrap();
            for i in 0..1_000 {
                let key = format!("{shape}:{i}");
                match adhoc.admit_key(&limiter, &key, budget) {
                    KeyAdmission::Added => {}
                    KeyAdmission::Evicted => evicted += 1,
                    KeyAdmission::Known => panic!("every key is new"),
                }
                assert!(limiter.limiter().check(key.as_str(), 1).is_allowed());
            }
        }
        assert_eq!(evicted, 50_000 - budget);
        let lock = adhoc.lock();
        let total: usize = lock.by_shape.values().map(|e| e.limiter.len()).sum();
        assert_eq!(total, budget);
        // Arrivals track the live keys, not every key ever seen.
        let arrivals: usize = lock.by_shape.values().map(|e| e.arrivals.len()).sum();
        assert_eq!(arrivals, budget);
        drop(lock);
        // The newest key is known (and so still counted) at the budget.
        let limiter = adhoc.limiter(&limit(50)).unwrap();
        assert_eq!(
            adhoc.admit_key(&limiter, "50:999", budget),
            KeyAdmission::Known
        );
    }

    #[test]
    fn a_window_longer_than_a_day_is_refused_with_a_way_out() {
        let adhoc = AdhocLimits::new();
        for window in ["365d", "10000d", "25h"] {
            let spec = AdhocLimit {
                window: WindowSpec::Text(window.into()),
                ..limit(1)
            };
            let err = adhoc.limiter(&spec).err().unwrap().to_string();
            assert!(err.contains("at most 1d") && err.contains("rule"), "{err}");
        }
        let day = AdhocLimit {
            window: WindowSpec::Text("1d".into()),
            ..limit(1)
        };
        assert!(adhoc.limiter(&day).is_ok());
    }
}
