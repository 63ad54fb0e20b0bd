//! The units a synced key keeps its times and rates in, with every conversion named.
//!
//! Absolute times are [`Nanos`] since the Unix epoch (store-corrected). A key keeps its own
//! times in 32 bits, as offsets from its window's start in the rule's tick ([`Timeline`]):
//! [`Stamp`] for a moment (rounded down), [`Deadline`] for an end (rounded up, none at zero).
//! Demand is a [`Demand`] (hits per nanosecond); the store carries times in milliseconds and
//! rates in thousandths of hits per second.

use sluice_core::Nanos;

/// Nanoseconds in a store millisecond.
const NS_PER_MS: u64 = 1_000_000;

/// A time in the store's entries (milliseconds since the epoch), in nanoseconds.
pub(crate) fn nanos_from_store_ms(ms: u64) -> Nanos {
    ms.saturating_mul(NS_PER_MS)
}

/// A time as the store's entries keep it: milliseconds since the epoch.
pub(crate) fn store_ms(at: Nanos) -> u64 {
    at / NS_PER_MS
}

/// The conversion between absolute times and a key's 32-bit offsets: one tick is
/// `window / 2^28` of the rule's window (at least 1 ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeline {
    tick_ns: u64,
}

/// A moment kept by a key: ticks from its window's start, rounded down (it may precede the
/// window start: a key's first sight carries into later windows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stamp(i32);

/// An end kept by a key: ticks from its window's start, rounded up; zero means none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deadline(u32);

impl Timeline {
    pub(crate) fn new(tick_ns: u64) -> Self {
        Self {
            tick_ns: tick_ns.max(1),
        }
    }

    /// `at` as a stamp from `window_start` (saturating at 32 bits).
    pub(crate) fn stamp(self, window_start: Nanos, at: Nanos) -> Stamp {
        // Times are nanoseconds since the epoch: both fit an i64 until the year 2262.
        let offset = (at as i64)
            .saturating_sub(window_start as i64)
            .div_euclid(self.tick_ns as i64);
        Stamp(offset.clamp(i32::MIN.into(), i32::MAX.into()) as i32)
    }

    /// The moment a stamp from `window_start` stands for.
    pub(crate) fn at(self, window_start: Nanos, stamp: Stamp) -> Nanos {
        window_start.saturating_add_signed(i64::from(stamp.0).saturating_mul(self.tick_ns as i64))
    }

    /// `until` as a deadline from `window_start`; none if `until` is not after it.
    pub(crate) fn deadline(self, window_start: Nanos, until: Nanos) -> Deadline {
        let ticks = until.saturating_sub(window_start).div_ceil(self.tick_ns);
        Deadline(u32::try_from(ticks).unwrap_or(u32::MAX))
    }

    /// The end a deadline from `window_start` stands for; zero when there is none.
    pub(crate) fn until(self, window_start: Nanos, deadline: Deadline) -> Nanos {
        if deadline.0 == 0 {
            return 0;
        }
        window_start.saturating_add(u64::from(deadline.0) * self.tick_ns)
    }
}

/// Demand: hits offered (admitted or not) per nanosecond.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Demand(f32);

impl Demand {
    /// From the store's thousandths of hits per second.
    pub(crate) fn from_store_milli(rate_milli: u64) -> Self {
        Demand((rate_milli as f64 / 1e12) as f32)
    }

    /// As the store keeps it: thousandths of hits per second.
    pub(crate) fn store_milli(self) -> u64 {
        (f64::from(self.0) * 1e12) as u64
    }

    pub(crate) fn per_ns(self) -> f64 {
        f64::from(self.0)
    }

    pub(crate) fn is_none(self) -> bool {
        self.0 == 0.0
    }

    /// The moving average with a new sample, `hits` offered over `elapsed` nanoseconds
    /// (`elapsed` > 0): the sample alone at first (taken over at least a quarter span: a cold
    /// key's early sync moments after its first hits would otherwise read two hits in 30 ms as
    /// 66 a second, and every instance would reserve room for it), then a sample over a whole
    /// span weighs half, and a shorter one (a key first seen late in a span) in proportion to
    /// its length.
    pub(crate) fn sampled(self, hits: u32, elapsed: u64, span_ns: u64) -> Self {
        let sample = f64::from(hits) / elapsed as f64;
        if self.is_none() {
            Demand((f64::from(hits) / elapsed.max(span_ns / 4) as f64) as f32)
        } else {
            let weight = 0.5 * (elapsed as f64 / span_ns.max(1) as f64).min(1.0);
            Demand(((1.0 - weight) * f64::from(self.0) + weight * sample) as f32)
        }
    }

    /// Hits expected over `ns` nanoseconds at this demand.
    pub(crate) fn hits_in(self, ns: u64) -> f64 {
        f64::from(self.0) * ns as f64
    }
}

impl From<f64> for Demand {
    fn from(per_ns: f64) -> Self {
        Demand(per_ns as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_rounds_down_and_a_deadline_up() {
        let t = Timeline::new(10);
        assert_eq!(t.at(1_000, t.stamp(1_000, 1_019)), 1_010);
        assert_eq!(t.at(1_000, t.stamp(1_000, 981)), 980);
        assert_eq!(t.until(1_000, t.deadline(1_000, 1_011)), 1_020);
        assert_eq!(t.until(1_000, t.deadline(1_000, 999)), 0);
    }

    #[test]
    fn offsets_saturate_instead_of_wrapping() {
        let t = Timeline::new(1);
        assert_eq!(t.stamp(0, i64::MAX as u64), Stamp(i32::MAX));
        assert_eq!(t.stamp(u64::MAX / 2, 0), Stamp(i32::MIN));
        assert_eq!(t.deadline(0, u64::MAX), Deadline(u32::MAX));
    }

    #[test]
    fn demand_round_trips_through_the_store_unit() {
        let d = Demand::default().sampled(3, 1_000_000_000, 1_000_000_000);
        assert_eq!(d.store_milli(), 3_000);
        assert!((Demand::from_store_milli(3_000).per_ns() - 3e-9).abs() < 1e-15);
        assert_eq!(store_ms(nanos_from_store_ms(42)), 42);
    }

    #[test]
    fn a_first_sample_over_moments_is_not_read_as_a_flood() {
        let span = 2_000_000_000;
        // Two hits 30 ms apart: at most 2 per half a second, not 66 a second.
        let d = Demand::default().sampled(2, 30_000_000, span);
        assert!(
            (d.per_ns() * 1e9 - 4.0).abs() < 1e-3,
            "{}",
            d.per_ns() * 1e9
        );
        // Over a whole span it is the sample itself.
        let d = Demand::default().sampled(10, span, span);
        assert!((d.per_ns() * 1e9 - 5.0).abs() < 1e-3);
        // Later samples average as before: a short one weighs in proportion to its length.
        let d = d.sampled(2, 30_000_000, span);
        assert!(d.per_ns() * 1e9 > 5.0);
    }
}
