//! An Envoy's assignment for one bucket, sized from the room its rules have.
//!
//! Envoy 1.40 enforces two strategies: blanket rules and token buckets (it logs "not yet
//! supported" for `requests_per_time_unit`). It reads a token bucket's rate as
//! `tokens_per_fill / fill_interval` in whole seconds, starts a new bucket full
//! (`max_tokens`), keeps its bucket when an assignment repeats the same numbers, and reports
//! every 5 s. So between two reports an Envoy admits at most `max_tokens + rate * 5 s`: the
//! assignment is sized so that this never exceeds its allowance for those 5 s.
//!
//! The allowance spreads the room left in the rule's window over the reports still to come
//! in it: a report's usage is counted when it arrives, so what Envoy admits until its next
//! report counts in the window that report lands in. With `n` whole report intervals left in
//! the window, each gets `remaining / n` (an Envoy that admitted little early in a window gets
//! more later); in the last, partial interval, whose report lands in the next window, the
//! allowance is the next window's pace. Each Envoy gets its demand's share of it.

use std::time::Duration;

/// How often Envoy reports (hard-coded at 5 s in Envoy 1.40, whatever `reporting_interval`
/// says): the horizon an assignment must cover without overshoot.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// An assignment's time to live: four reports. An unchanged assignment is renewed when at most
/// two report intervals of it are left (renew.rs), so one lost report or a Sluice restart
/// leaves Envoy on its last assignment.
pub const ASSIGNMENT_TTL: Duration = Duration::from_secs(20);

/// An allow-all assignment's time to live, for a bucket no rule limits.
pub const UNLIMITED_TTL: Duration = Duration::from_secs(3600);

/// The fill interval of every token bucket Sluice assigns. Envoy compares an assignment with
/// the previous one by `max_tokens`, `tokens_per_fill` and `fill_interval`'s nanoseconds only,
/// so the interval stays fixed and the rate is carried by `tokens_per_fill`.
pub const FILL_INTERVAL_SECS: u64 = 10;

/// Below a rate of one token per [`FILL_INTERVAL_SECS`], the interval used instead.
pub const SLOW_FILL_INTERVAL_SECS: u64 = 60;

/// Below a rate of one token per [`SLOW_FILL_INTERVAL_SECS`]: one token an hour (Envoy needs
/// a fill interval and a token per fill).
const IDLE_FILL_INTERVAL_SECS: u64 = 3600;

/// What the most limiting rule of a bucket's descriptor says now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Room {
    /// Requests the window has left.
    pub remaining: u64,
    /// Time until the window resets.
    pub reset_after: Duration,
    /// The rule's limit per window.
    pub limit: u64,
    /// The rule's window.
    pub window: Duration,
    /// This instance's part of the room (1: its own, or alone): other Sluice instances hand
    /// the rest to their Envoys (`Engine::fleet_parts`).
    pub part: f64,
}

/// What an Envoy is told to do with a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// No rule limits the bucket.
    AllowAll,
    /// No room until the window allows more.
    DenyAll,
    /// A token bucket: starts with `max_tokens`, gains `tokens_per_fill` every
    /// `fill_interval_secs`.
    TokenBucket {
        /// Burst, and the tokens a new bucket starts with.
        max_tokens: u32,
        /// Tokens added per interval.
        tokens_per_fill: u32,
        /// The interval, in whole seconds.
        fill_interval_secs: u64,
    },
}

impl Assignment {
    /// Its time to live.
    pub fn ttl(self) -> Duration {
        match self {
            Assignment::AllowAll => UNLIMITED_TTL,
            Assignment::DenyAll | Assignment::TokenBucket { .. } => ASSIGNMENT_TTL,
        }
    }

    /// Most requests it admits over `horizon` from a full bucket.
    pub fn admits_at_most(self, horizon: Duration) -> f64 {
        match self {
            Assignment::AllowAll => f64::INFINITY,
            Assignment::DenyAll => 0.0,
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_secs,
            } => {
                let rate = f64::from(tokens_per_fill) / fill_interval_secs as f64;
                f64::from(max_tokens) + rate * horizon.as_secs_f64()
            }
        }
    }
}

/// What all the Envoys of a bucket may admit over the next `horizon` (one report interval)
/// under `room`.
pub fn allowance(room: Room, horizon: Duration) -> f64 {
    let (t, h) = (room.reset_after.as_secs_f64(), horizon.as_secs_f64());
    let intervals_left = if h > 0.0 { (t / h).floor() } else { 0.0 };
    if intervals_left >= 1.0 {
        return room.remaining as f64 / intervals_left;
    }
    match room.window.as_secs_f64() {
        w if w > 0.0 => room.limit as f64 * (h / w).min(1.0),
        _ => 0.0,
    }
}

/// The assignment of an Envoy whose demand is `share` (0..=1) of the bucket's demand on this
/// instance, under `room` (`None`: no rule limits the bucket), of which this instance hands
/// out its part.
pub fn assign(room: Option<Room>, share: f64) -> Assignment {
    let Some(room) = room else {
        return Assignment::AllowAll;
    };
    let share = if share.is_finite() {
        share.clamp(0.0, 1.0)
    } else {
        1.0
    };
    let part = if room.part.is_finite() {
        room.part.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let mine = allowance(room, REPORT_EVERY) * part * share;
    // Less than one request (and the hourly token): admitting one would overshoot, so
    // nothing until the next report.
    if mine < 1.01 {
        return Assignment::DenyAll;
    }
    // A tenth of the allowance as burst (at least one request); the rest paced, so that a new
    // (full) bucket plus its refills over a report interval stay within the allowance.
    let max_tokens = (mine / 10.0).floor().max(1.0);
    let rate = (mine - max_tokens) / REPORT_EVERY.as_secs_f64();
    let per = |secs: u64| (rate * secs as f64).floor();
    let (tokens, interval) = if per(FILL_INTERVAL_SECS) >= 1.0 {
        (per(FILL_INTERVAL_SECS), FILL_INTERVAL_SECS)
    } else if per(SLOW_FILL_INTERVAL_SECS) >= 1.0 {
        (per(SLOW_FILL_INTERVAL_SECS), SLOW_FILL_INTERVAL_SECS)
    } else {
        (1.0, IDLE_FILL_INTERVAL_SECS)
    };
    Assignment::TokenBucket {
        max_tokens: max_tokens.min(f64::from(u32::MAX)) as u32,
        tokens_per_fill: tokens.min(f64::from(u32::MAX)) as u32,
        fill_interval_secs: interval,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(remaining: u64, reset_secs: u64, limit: u64, window_secs: u64) -> Room {
        Room {
            remaining,
            reset_after: Duration::from_secs(reset_secs),
            limit,
            window: Duration::from_secs(window_secs),
            part: 1.0,
        }
    }

    #[test]
    fn no_rule_allows_all_for_long() {
        assert_eq!(assign(None, 0.5), Assignment::AllowAll);
        assert_eq!(Assignment::AllowAll.ttl(), UNLIMITED_TTL);
    }

    #[test]
    fn the_room_is_spread_over_the_reports_left_in_the_window() {
        // 100 a 20 s window, all left: a quarter of it per 5 s report interval.
        assert_eq!(allowance(room(100, 20, 100, 20), REPORT_EVERY), 25.0);
        // 30 left with 14 s to go: two more reports land in this window, 15 each.
        assert_eq!(allowance(room(30, 14, 100, 20), REPORT_EVERY), 15.0);
    }

    #[test]
    fn a_steady_demand_over_the_limit_is_admitted_the_limit_per_window() {
        // Reports 1 s after each 5 s mark of a 20 s window, every allowance used; the last
        // interval's usage lands in the next window.
        let mut carried = 25.0;
        for _ in 0..10 {
            let mut remaining = 100.0 - carried;
            let mut admitted = 0.0;
            for reset in [19, 14, 9, 4] {
                let r = room(remaining as u64, reset, 100, 20);
                let a = allowance(r, REPORT_EVERY).floor();
                admitted += a;
                if reset >= 5 {
                    remaining -= a;
                } else {
                    carried = a;
                }
            }
            assert!((95.0..=100.0).contains(&admitted), "{admitted}");
        }
    }

    #[test]
    fn the_last_partial_interval_gets_the_next_windows_pace() {
        // 2 s left with nothing: its report lands in the next window, at 5/s.
        assert_eq!(allowance(room(0, 2, 100, 20), REPORT_EVERY), 25.0);
        assert!(matches!(
            assign(Some(room(0, 2, 100, 20)), 1.0),
            Assignment::TokenBucket { .. }
        ));
    }

    #[test]
    fn no_room_with_the_window_far_from_its_end_denies() {
        assert_eq!(assign(Some(room(0, 12, 100, 20)), 1.0), Assignment::DenyAll);
        assert_eq!(Assignment::DenyAll.ttl(), ASSIGNMENT_TTL);
    }

    #[test]
    fn a_report_interval_never_admits_more_than_the_allowance() {
        for remaining in [1, 3, 7, 10, 99, 100, 1_000, 123_456] {
            for reset in [1, 4, 5, 6, 20, 60, 3600] {
                for share in [0.01, 0.1, 0.5, 0.9, 1.0] {
                    let r = room(remaining, reset, 100_000, 3600);
                    let a = assign(Some(r), share);
                    let most = allowance(r, REPORT_EVERY) * share;
                    let admits = a.admits_at_most(REPORT_EVERY);
                    assert!(
                        admits <= most + 1e-9,
                        "{r:?} share {share}: {a:?} admits {admits} > {most}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_steady_assignment_gives_most_of_the_allowance() {
        // 1000 a minute, all left, one Envoy: 83.3 per interval; at least 90% of it paced.
        let a = assign(Some(room(1000, 60, 1000, 60)), 1.0);
        let Assignment::TokenBucket {
            tokens_per_fill,
            fill_interval_secs,
            ..
        } = a
        else {
            panic!("expected a token bucket, got {a:?}");
        };
        let per_interval = f64::from(tokens_per_fill) / fill_interval_secs as f64 * 5.0;
        assert!(per_interval >= 0.85 * 83.3, "{a:?}");
    }

    #[test]
    fn shares_split_the_allowance_by_demand() {
        let r = room(100, 20, 100, 20);
        let big = assign(Some(r), 0.9).admits_at_most(REPORT_EVERY);
        let small = assign(Some(r), 0.1).admits_at_most(REPORT_EVERY);
        assert!(big + small <= 25.0, "{big} + {small}");
        assert!(big > 5.0 * small, "{big} vs {small}");
    }

    #[test]
    fn less_than_one_request_denies() {
        assert_eq!(assign(Some(room(1, 60, 10, 60)), 0.5), Assignment::DenyAll);
    }
}
