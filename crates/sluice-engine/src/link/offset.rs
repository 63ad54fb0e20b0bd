//! The offset between the store's clock and this host's, from the store's `TIME` replies,
//! guarded against bad readings: a reading from a slow round trip is too uncertain to use, an
//! offset beyond an hour is refused (a misconfigured store clock must not move every window),
//! and a jump of more than a second is taken only once three readings in a row agree on it
//! (one odd reply must not move every key's window).

use std::sync::atomic::{AtomicI64, Ordering};

use metrics::{counter, gauge};
use parking_lot::Mutex;
use sluice_core::Nanos;

const MS: i64 = 1_000_000;
/// Readings from a round trip longer than this are not used (the midpoint may be off by half).
const MAX_ROUND_TRIP_NS: u64 = 100 * MS as u64;
/// The largest offset followed.
const MAX_OFFSET_NS: i64 = 3_600_000 * MS;
/// A change larger than this needs confirming.
const MAX_JUMP_NS: i64 = 1_000 * MS;
/// Readings that confirm a jump agree with each other within this.
const AGREE_NS: i64 = 50 * MS;
/// Readings in a row that confirm a jump.
const CONFIRMATIONS: u32 = 3;

/// What became of one reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reading {
    /// The offset now follows it.
    Taken,
    /// Its round trip was too slow to tell.
    TooSlow,
    /// Beyond the largest offset followed.
    OutOfRange,
    /// A jump not yet confirmed by enough readings.
    Unconfirmed,
}

/// The measured offset (store time minus local time, nanoseconds).
pub(crate) struct ClockOffset {
    offset_ns: AtomicI64,
    track: Mutex<Track>,
}

#[derive(Default)]
struct Track {
    /// Whether a reading has been taken yet (the first one sets the offset, jump or not).
    established: bool,
    /// A jump being confirmed: its offset and the readings that agreed so far.
    candidate: Option<(i64, u32)>,
}

impl ClockOffset {
    pub(crate) fn new() -> Self {
        Self {
            offset_ns: AtomicI64::new(0),
            track: Mutex::new(Track::default()),
        }
    }

    pub(crate) fn get(&self) -> i64 {
        self.offset_ns.load(Ordering::Relaxed)
    }

    /// Takes the store's clock `store_time` as read between `sent` and `received` (local raw
    /// times): the offset is measured from the round trip's midpoint.
    pub(crate) fn observe(&self, sent: Nanos, received: Nanos, store_time: Nanos) -> Reading {
        let reading = self.judge(sent, received, store_time);
        if reading != Reading::Taken {
            let why = match reading {
                Reading::TooSlow => "slow_round_trip",
                Reading::OutOfRange => "out_of_range",
                _ => "unconfirmed_jump",
            };
            counter!("sluice_clock_readings_ignored_total", "reason" => why).increment(1);
        }
        reading
    }

    fn judge(&self, sent: Nanos, received: Nanos, store_time: Nanos) -> Reading {
        if received.saturating_sub(sent) > MAX_ROUND_TRIP_NS {
            return Reading::TooSlow;
        }
        let midpoint = sent / 2 + received / 2;
        let offset = (store_time as i128 - midpoint as i128).clamp(-(1 << 62), 1 << 62) as i64;
        if offset.abs() > MAX_OFFSET_NS {
            tracing::warn!(
                offset_s = offset / 1_000_000_000,
                "the store's clock differs from this host's by more than an hour; not followed (check both clocks)"
            );
            return Reading::OutOfRange;
        }
        let mut track = self.track.lock();
        let current = self.get();
        if track.established && (offset - current).abs() > MAX_JUMP_NS {
            let agreed = match track.candidate {
                Some((seen, n)) if (offset - seen).abs() <= AGREE_NS => n + 1,
                _ => 1,
            };
            if agreed < CONFIRMATIONS {
                track.candidate = Some((offset, agreed));
                return Reading::Unconfirmed;
            }
            tracing::warn!(
                from_ms = current / MS,
                to_ms = offset / MS,
                "the store's clock moved against this host's; following it"
            );
        }
        track.established = true;
        track.candidate = None;
        self.offset_ns.store(offset, Ordering::Relaxed);
        gauge!("sluice_clock_offset_seconds").set(offset as f64 / 1e9);
        Reading::Taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const T: u64 = 1_800_000_000 * S;

    /// A reading with a 2 ms round trip at local time `t` of a store `offset` ahead.
    fn read(c: &ClockOffset, t: u64, offset: i64) -> Reading {
        c.observe(t, t + 2_000_000, (t as i64 + 1_000_000 + offset) as u64)
    }

    #[test]
    fn the_first_reading_sets_it_and_small_moves_follow() {
        let c = ClockOffset::new();
        assert_eq!(read(&c, T, 5 * S as i64), Reading::Taken);
        assert_eq!(c.get(), 5 * S as i64);
        assert_eq!(read(&c, T + S, 5 * S as i64 + 300 * MS), Reading::Taken);
        assert_eq!(c.get(), 5 * S as i64 + 300 * MS);
    }

    #[test]
    fn a_slow_round_trip_or_an_offset_beyond_an_hour_is_not_followed() {
        let c = ClockOffset::new();
        assert_eq!(c.observe(T, T + S, T + S / 2 + 7 * S), Reading::TooSlow);
        assert_eq!(read(&c, T, 2 * 3600 * S as i64), Reading::OutOfRange);
        assert_eq!(read(&c, T, -2 * 3600 * S as i64), Reading::OutOfRange);
        assert_eq!(c.get(), 0);
    }

    #[test]
    fn a_jump_is_taken_only_when_three_readings_in_a_row_agree() {
        let c = ClockOffset::new();
        read(&c, T, 0);
        // One odd reply: ignored.
        assert_eq!(read(&c, T + S, 30 * S as i64), Reading::Unconfirmed);
        assert_eq!(read(&c, T + 2 * S, 0), Reading::Taken);
        assert_eq!(c.get(), 0);
        // A real step of the store's clock: taken on the third reading.
        assert_eq!(read(&c, T + 3 * S, 30 * S as i64), Reading::Unconfirmed);
        assert_eq!(
            read(&c, T + 4 * S, 30 * S as i64 + 10 * MS),
            Reading::Unconfirmed
        );
        assert_eq!(read(&c, T + 5 * S, 30 * S as i64 + 5 * MS), Reading::Taken);
        assert_eq!(c.get(), 30 * S as i64 + 5 * MS);
    }
}
