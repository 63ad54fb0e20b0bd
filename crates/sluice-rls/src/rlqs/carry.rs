//! What a bucket's room does not show: requests Envoys admitted that no report will count, and
//! requests counted in a window that were admitted before it began.
//!
//! A report counts what its Envoy admitted over the report interval before it, in the window
//! it arrives in. So the first reports of a window carry requests admitted at the end of the
//! previous one ([`Carried`]), and what Envoys admit in a window's last, partial report
//! interval is counted in the next. The last interval's rate is the next window's pace
//! (sizing.rs); within the room this window has left *and what it carried in*, as those
//! requests took room that the window's own last interval gives back. Within the room alone,
//! the window's steady true count fell short of the limit by what it carried in (two Envoys
//! at three times a limit of 100 per 20 s: 85 to 93 a window in the simulator).

use sluice_core::Nanos;

use super::sizing::Room;

/// What ended streams admitted after their last reports (estimated), kept out of the room
/// until the window they were admitted in ends.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Unreported {
    requests: f64,
    until: Nanos,
}

impl Unreported {
    /// The requests still out of the room at `now`.
    pub(super) fn at(self, now: Nanos) -> f64 {
        if now < self.until { self.requests } else { 0.0 }
    }

    /// Adds `requests` admitted in the window ending at `until`.
    /// Estimates made for different windows (the bucket's limiting rule changed) are not
    /// added up: the later one stands.
    pub(super) fn add(&mut self, requests: f64, until: Nanos, now: Nanos) {
        if requests <= 0.0 || until <= now {
            return;
        }
        self.requests = if until == self.until {
            self.at(now) + requests
        } else {
            requests
        };
        self.until = until;
    }
}

/// The requests counted in a bucket's current window that were admitted before it began.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Carried {
    requests: f64,
    /// When the window they were counted in ends.
    until: Nanos,
    /// That window's length (how far apart two windows' ends are at least).
    window: Nanos,
}

impl Carried {
    /// The requests carried into the window ending at `until`.
    fn of(self, until: Nanos) -> f64 {
        if same_end(self.until, until, self.window) {
            self.requests
        } else {
            0.0
        }
    }

    /// Notes a report arriving at `now` under `room` that counted `allowed` requests admitted
    /// over the `seconds` before it: the part of them admitted before the window began (taken
    /// as spread evenly over those seconds).
    pub(super) fn add(&mut self, allowed: f64, seconds: f64, room: Room, now: Nanos) {
        let until = ends(room, now);
        let window = room.window.as_nanos().min(u128::from(u64::MAX)) as u64;
        let into_window = room.window.saturating_sub(room.reset_after).as_secs_f64();
        if !(allowed > 0.0 && seconds > into_window && allowed.is_finite()) {
            if !same_end(self.until, until, window) {
                *self = Self {
                    requests: 0.0,
                    until,
                    window,
                };
            }
            return;
        }
        let before = allowed * (seconds - into_window) / seconds;
        *self = Self {
            requests: self.of(until) + before,
            until,
            window,
        };
    }

    /// `room` as the last, partial report interval of its window may spend it: with the
    /// requests its window carried in given back (they were admitted in the previous one).
    /// Other intervals, and rooms other Sluice instances share, as they are.
    /// A room with nothing left is left alone: its window counted more than its limit (the
    /// requests carried in are then not all room given back), or it is a penalty's cooldown.
    pub(super) fn spendable(self, room: Room, horizon: std::time::Duration, now: Nanos) -> Room {
        if room.shared || room.reset_after >= horizon || room.remaining == 0 {
            return room;
        }
        // At most a report interval of the limit's pace: what the window before could carry
        // in from its own last interval (the steady case); a rule whose `reset_after` is not
        // a fixed window's end (a sliding window, a bucket) gets no more than that.
        let window = room.window.as_secs_f64();
        let pace = if window > 0.0 {
            room.limit as f64 * (horizon.as_secs_f64() / window).min(1.0)
        } else {
            0.0
        };
        let back = self.of(ends(room, now)).min(pace).floor() as u64;
        Room {
            remaining: room.remaining.saturating_add(back).min(room.limit),
            ..room
        }
    }
}

/// Whether two window ends read at different times are the same: the engine's `reset_after`
/// is read to the nanosecond, and the ends of two windows of `window` are a window apart.
fn same_end(a: Nanos, b: Nanos, window: Nanos) -> bool {
    a.abs_diff(b) < (window / 2).min(500_000_000)
}

/// When the window of `room` ends, read at `now`.
fn ends(room: Room, now: Nanos) -> Nanos {
    let reset = room.reset_after.as_nanos().min(u128::from(u64::MAX)) as u64;
    now.saturating_add(reset)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const S: Nanos = 1_000_000_000;

    fn room(remaining: u64, reset_secs: f64) -> Room {
        Room {
            remaining,
            reset_after: Duration::from_secs_f64(reset_secs),
            limit: 100,
            window: Duration::from_secs(20),
            part: 1.0,
            shared: false,
        }
    }

    #[test]
    fn requests_admitted_before_the_window_are_given_back_to_its_last_interval() {
        let mut c = Carried::default();
        // 1 s into the window (19 s left), a report of 5 s: 4 of its 5 seconds were the
        // previous window's, so 16 of its 20 requests.
        c.add(20.0, 5.0, room(80, 19.0), 101 * S);
        // A report wholly in the window carries nothing more.
        c.add(10.0, 5.0, room(70, 14.0), 106 * S);
        // The last, partial interval (4 s left) may spend the 16 besides the 10 left; an
        // earlier one spends the room as it is.
        let last = c.spendable(room(10, 4.0), Duration::from_secs(5), 116 * S);
        assert_eq!(last.remaining, 26);
        let earlier = c.spendable(room(40, 9.0), Duration::from_secs(5), 111 * S);
        assert_eq!(earlier.remaining, 40);
        // The next window starts from nothing.
        let next = c.spendable(room(10, 4.0), Duration::from_secs(5), 136 * S);
        assert_eq!(next.remaining, 10);
        c.add(0.0, 5.0, room(100, 19.0), 121 * S);
        assert_eq!(c.of(140 * S), 0.0);
    }

    #[test]
    fn a_shared_room_and_nonsense_counts_are_left_alone() {
        let mut c = Carried::default();
        c.add(f64::INFINITY, 5.0, room(80, 19.0), 101 * S);
        c.add(f64::NAN, 5.0, room(80, 19.0), 101 * S);
        c.add(-3.0, 5.0, room(80, 19.0), 101 * S);
        assert_eq!(c.of(120 * S), 0.0);
        c.add(1e12, 5.0, room(80, 19.0), 101 * S);
        let mut shared = room(10, 4.0);
        shared.shared = true;
        let r = c.spendable(shared, Duration::from_secs(5), 116 * S);
        assert_eq!(r.remaining, 10);
        // Never more than a report interval of the limit's pace (25 of 100 per 20 s).
        let r = c.spendable(room(10, 4.0), Duration::from_secs(5), 116 * S);
        assert_eq!(r.remaining, 35);
        // A window that counted more than its limit, or a penalty's cooldown: nothing back.
        let r = c.spendable(room(0, 4.0), Duration::from_secs(5), 116 * S);
        assert_eq!(r.remaining, 0);
    }

    #[test]
    fn an_ended_streams_estimate_lapses_with_its_window() {
        let mut u = Unreported::default();
        u.add(12.0, 20 * S, 4 * S);
        u.add(3.0, 20 * S, 5 * S);
        assert_eq!(u.at(6 * S), 15.0);
        // One for another window (the limiting rule changed) stands alone.
        let mut v = u;
        v.add(2.0, 25 * S, 6 * S);
        assert_eq!(v.at(7 * S), 2.0);
        assert_eq!(u.at(20 * S), 0.0);
        // Nothing added for a window already over.
        u.add(5.0, 19 * S, 21 * S);
        assert_eq!(u.at(21 * S), 0.0);
    }
}
