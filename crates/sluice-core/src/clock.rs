//! Time sources. The only module allowed to read the operating system's clock.
//!
//! Every algorithm takes `now` as an argument; a [`Clock`] is what produces it. Times are
//! nanoseconds since the Unix epoch, so that windows line up across processes and machines
//! (window number = `now / window`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Nanoseconds since the Unix epoch.
pub type Nanos = u64;

/// Converts a [`Duration`] to nanoseconds, saturating at `u64::MAX` (about 584 years).
#[inline]
pub fn duration_to_nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds since the Unix epoch.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// The production clock: a monotonic TSC reading (`quanta`) anchored to the wall clock once.
///
/// `quanta` reads the TSC in a few nanoseconds where `SystemTime::now` costs a syscall-free
/// but slower vDSO call (see `docs/BENCHMARKS.md`, bench `clock`). Anchoring once means the
/// clock never goes backwards even when NTP steps the wall clock; the synced engine corrects
/// for drift against the store's `TIME`. Its rate is the TSC's as calibrated when the clock is
/// made, which can be off by hundreds of ppm; [`crate::CoarseClock`] corrects for that.
#[derive(Clone, Debug)]
pub struct SystemClock {
    clock: quanta::Clock,
    anchor_raw: u64,
    anchor_epoch: Nanos,
}

impl SystemClock {
    /// Creates a clock anchored to the current wall-clock time.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        #[allow(clippy::disallowed_methods)]
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let anchor_raw = clock.raw();
        Self {
            clock,
            anchor_raw,
            anchor_epoch: duration_to_nanos(wall),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Nanos {
        let elapsed = self.clock.delta_as_nanos(self.anchor_raw, self.clock.raw());
        self.anchor_epoch.saturating_add(elapsed)
    }
}

/// The standard library's wall clock, read on every call. Kept as the measured alternative to
/// [`SystemClock`]; it can go backwards when the wall clock is stepped.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdClock;

impl Clock for StdClock {
    #[inline]
    fn now(&self) -> Nanos {
        #[allow(clippy::disallowed_methods)]
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        duration_to_nanos(wall)
    }
}

/// A clock that only moves when told to. Clones share the same time, so a test can hold one
/// handle and give another to the limiter.
///
/// ```
/// use sluice_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_000);
/// let handle = clock.clone();
/// handle.advance(Duration::from_nanos(500));
/// assert_eq!(clock.now(), 1_500);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// Creates a clock that reads `start` nanoseconds since the epoch.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(duration_to_nanos(by), Ordering::Relaxed);
    }

    /// Sets the clock to `now`; this may move it backwards, which tests use to check that the
    /// algorithms tolerate it.
    pub fn set(&self, now: Nanos) {
        self.now.store(now, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_near_the_wall_clock_and_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
        let wall = StdClock.now();
        assert!(
            wall.abs_diff(a) < 1_000_000_000,
            "anchored clock drifted: {a} vs {wall}"
        );
    }

    #[test]
    fn manual_clock_clones_share_time() {
        let clock = ManualClock::new(10);
        let other = clock.clone();
        other.advance(Duration::from_nanos(5));
        assert_eq!(clock.now(), 15);
        other.set(3);
        assert_eq!(clock.now(), 3);
    }
}
