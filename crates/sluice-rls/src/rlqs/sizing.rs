//! An Envoy's assignment for one bucket, sized from the room its rules have.
//!
//! Envoy 1.40 enforces two strategies: blanket rules and token buckets (it logs "not yet
//! supported" for `requests_per_time_unit`). It reads a token bucket's rate as
//! `tokens_per_fill / fill_interval` in whole seconds, refills it continuously, keeps its
//! bucket when an assignment repeats the same numbers, and reports every 5 s. A bucket's first
//! token bucket starts full; one that replaces another takes over the old one's clock
//! (measured, docs/RLQS.md): a drained bucket's replacement starts about empty, with a few
//! tokens where its rate is several times the old one's, and an idle one's full. Between two
//! reports an Envoy admits at most `max_tokens + rate x 5 s`: the assignment is sized so that
//! this never exceeds its allowance.
//!
//! The rate is the window's pace: the room left spread over the whole report intervals left
//! in it (a demand over the limit, drained at every report, is admitted exactly the room
//! by the window's end); in the last, partial interval, whose report lands in the next window,
//! the next window's pace within the room this window has left (what Envoy admits then is
//! counted in the next window but happens in this one). The burst saves up to half the room
//! left ([`OF_THE_ROOM`]) for clients under the limit whose requests come in clumps (a
//! bucket as small as one interval's pace refused a quarter of random arrivals at half the
//! limit); the two together never exceed the room. Each Envoy gets its demand's share.
//! Where other Sluice instances share the room, the allowance is the pace alone, a tenth of
//! it as burst ([`assign`]).
//!
//! An Envoy whose bucket is drained admits its refill until its next report, whatever its
//! depth: where this instance hands out the whole room, its bucket is made a second of its
//! rate deep ([`Assignment::drained`], applied by the demand book), so that
//! random arrivals do not waste the refill of a bucket of one token. The last interval may
//! also spend what the window carried in from the one before (carry.rs).

use std::time::Duration;

/// How often Envoy reports (hard-coded at 5 s in Envoy 1.40, whatever `reporting_interval`
/// says): the horizon an assignment must cover without overshoot.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// The shortest time to live of an assignment: four reports. An unchanged assignment is
/// renewed when at most two report intervals of it are left (renew.rs), so one lost report or
/// a Sluice restart leaves Envoy on its last assignment. A token bucket lives until its
/// window ends ([`token_bucket_ttl`]).
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
    /// Whether other Sluice instances hand out the same room (even while this one's part is
    /// whole).
    pub shared: bool,
}

/// What an Envoy is told to do with a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// No rule limits the bucket.
    AllowAll,
    /// No room: for `ttl`, until the window allows more (and one report interval, for the
    /// report that brings the next assignment), or [`ASSIGNMENT_TTL`] when this Envoy's share
    /// alone is too small.
    DenyAll {
        /// Its time to live.
        ttl: Duration,
    },
    /// A token bucket: starts with `max_tokens`, gains `tokens_per_fill` every
    /// `fill_interval_secs`.
    TokenBucket {
        /// Burst, and the tokens a new bucket starts with.
        max_tokens: u32,
        /// Tokens added per interval.
        tokens_per_fill: u32,
        /// The interval, in whole seconds.
        fill_interval_secs: u64,
        /// Its time to live ([`token_bucket_ttl`]).
        ttl: Duration,
    },
}

/// A token bucket's time to live under `room`: until its window ends and one report interval
/// more (the report that brings the next window's assignment), at most a window of its rule,
/// from [`ASSIGNMENT_TTL`] to an hour. Its rate is the window's pace over what is left of it,
/// so an Envoy that loses Sluice (a restart, a partition) keeps admitting the rest of the
/// window's room at about that pace, where a 20 s time to live let
/// `expired_assignment_behavior` through in the middle of a long window (a 30 s outage in a
/// 60 s window went 37.7% over its limit in the simulator, 13.3% with this one). Late in a
/// window the pace is above the limit's (the room left over few intervals): kept for a whole
/// window after it, it would admit several times the limit. A live Sluice renews it two report
/// intervals before it lapses.
pub fn token_bucket_ttl(room: Room) -> Duration {
    let until_next = room.reset_after.saturating_add(REPORT_EVERY);
    until_next
        .min(room.window)
        .clamp(ASSIGNMENT_TTL, UNLIMITED_TTL)
}

impl Assignment {
    /// Its time to live.
    pub fn ttl(self) -> Duration {
        match self {
            Assignment::AllowAll => UNLIMITED_TTL,
            Assignment::DenyAll { ttl } => ttl,
            Assignment::TokenBucket { ttl, .. } => ttl,
        }
    }

    /// Whether Envoy holding `self` keeps its bucket when it gets `other`: both token buckets
    /// of the same numbers (Envoy compares those, not the time to live).
    pub fn same_bucket(self, other: Assignment) -> bool {
        let numbers = |a| match a {
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_secs,
                ..
            } => Some((max_tokens, tokens_per_fill, fill_interval_secs)),
            _ => None,
        };
        numbers(self).is_some() && numbers(self) == numbers(other)
    }

    /// The same numbers with time to live `ttl` (an allow-all keeps its own).
    pub fn with_ttl(self, ttl: Duration) -> Self {
        match self {
            Assignment::AllowAll => Assignment::AllowAll,
            Assignment::DenyAll { .. } => Assignment::DenyAll { ttl },
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_secs,
                ..
            } => Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_secs,
                ttl,
            },
        }
    }

    /// The assignment of an Envoy whose bucket is drained (it denied requests since its last
    /// report): as deep as a second of its rate, if that is more. A replacing token bucket
    /// takes over the old one's clock (about empty), so until the next report it admits its
    /// refill whatever its depth; a bucket of one token wastes the refill that comes while it
    /// is full, and clients arriving at random keep it full a fifth of the time at three times
    /// its rate (a window of 100 admitted 85 to 93).
    pub fn drained(self) -> Self {
        match self {
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_secs,
                ttl,
            } => {
                let second = f64::from(tokens_per_fill) / fill_interval_secs.max(1) as f64;
                Assignment::TokenBucket {
                    max_tokens: max_tokens.max(second.ceil().min(f64::from(u32::MAX)) as u32),
                    tokens_per_fill,
                    fill_interval_secs,
                    ttl,
                }
            }
            other => other,
        }
    }

    /// Most requests it admits over `horizon` from a full bucket.
    pub fn admits_at_most(self, horizon: Duration) -> f64 {
        match self {
            Assignment::TokenBucket { max_tokens, .. } => {
                f64::from(max_tokens) + self.refills(horizon)
            }
            other => other.refills(horizon),
        }
    }

    /// Most requests it admits over `horizon` from an empty bucket: what it refills.
    pub fn refills(self, horizon: Duration) -> f64 {
        match self {
            Assignment::AllowAll => f64::INFINITY,
            Assignment::DenyAll { .. } => 0.0,
            Assignment::TokenBucket {
                tokens_per_fill,
                fill_interval_secs,
                ..
            } => {
                let rate = f64::from(tokens_per_fill) / fill_interval_secs as f64;
                rate * horizon.as_secs_f64()
            }
        }
    }
}

/// The part of the room left that all the Envoys of a bucket together may admit before their
/// next reports, when it is more than the window's pace.
pub const OF_THE_ROOM: f64 = 0.5;

/// The whole report intervals of `horizon` left in the window.
fn intervals_left(room: Room, horizon: Duration) -> f64 {
    let (t, h) = (room.reset_after.as_secs_f64(), horizon.as_secs_f64());
    if h > 0.0 { (t / h).floor() } else { 0.0 }
}

/// The window's pace over the next `horizon`: the room left spread over the whole report
/// intervals left in the window, or in the last, partial one, the next window's pace within
/// the room this one has left (what Envoy admits then is counted in the next window, but
/// happens in this one).
pub fn pace(room: Room, horizon: Duration) -> f64 {
    let n = intervals_left(room, horizon);
    if n >= 1.0 {
        return room.remaining as f64 / n;
    }
    let next = match room.window.as_secs_f64() {
        w if w > 0.0 => room.limit as f64 * (horizon.as_secs_f64() / w).min(1.0),
        _ => 0.0,
    };
    if room.shared {
        next
    } else {
        next.min(room.remaining as f64)
    }
}

/// What all the Envoys of a bucket may admit at most over the next `horizon` (one report
/// interval) under `room`: the [`pace`], and tokens saved up to [`OF_THE_ROOM`] of the room
/// left, never more than the room. Only where this instance hands out the whole room: with
/// other Sluice instances sharing it, each reads the others' admissions a flush late, and
/// saved bursts spent on several instances at once took windows to 132 of 100 (two
/// instances, the split turning from 9:1 to even); there the allowance is the pace, and in
/// the last, partial interval the next window's (the sizing the two-instance test holds to
/// 85% to 110%: [`assign`]).
pub fn allowance(room: Room, horizon: Duration) -> f64 {
    if room.shared {
        return pace(room, horizon);
    }
    let remaining = room.remaining as f64;
    (pace(room, horizon) + remaining * OF_THE_ROOM).min(remaining)
}

/// Tokens per fill and the fill interval of a rate of at most `per_second`: the whole tokens
/// per [`FILL_INTERVAL_SECS`], or per [`SLOW_FILL_INTERVAL_SECS`] below one, or else one an
/// hour.
fn fill(per_second: f64) -> (f64, u64) {
    let per = |secs: u64| (per_second * secs as f64).floor();
    if per(FILL_INTERVAL_SECS) >= 1.0 {
        (per(FILL_INTERVAL_SECS), FILL_INTERVAL_SECS)
    } else if per(SLOW_FILL_INTERVAL_SECS) >= 1.0 {
        (per(SLOW_FILL_INTERVAL_SECS), SLOW_FILL_INTERVAL_SECS)
    } else {
        (1.0, IDLE_FILL_INTERVAL_SECS)
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
    let ours = allowance(room, REPORT_EVERY) * part;
    let mine = ours * share;
    if room.shared {
        return shared(mine, token_bucket_ttl(room));
    }
    // Less than one request (and the hourly token): admitting one would overshoot, so
    // nothing until the next report, or while the room is gone, until the window allows
    // more. Envoy keeps that through a Sluice outage: a key over its limit stays denied where,
    // on a shorter time to live, `expired_assignment_behavior` let it through.
    if ours < 1.01 {
        let until_room = room.reset_after.saturating_add(REPORT_EVERY);
        return Assignment::DenyAll {
            ttl: until_room.clamp(ASSIGNMENT_TTL, UNLIMITED_TTL),
        };
    }
    if mine < 1.01 {
        return Assignment::DenyAll {
            ttl: ASSIGNMENT_TTL,
        };
    }
    let h = REPORT_EVERY.as_secs_f64();
    let rate = pace(room, REPORT_EVERY) * part * share / h;
    // Whole tokens per fill round the rate down; the burst takes the rest of the allowance,
    // at least one request (then the rate gives way to it).
    let (mut tokens, mut interval) = fill(rate);
    let per_second = |tokens: f64, interval: u64| tokens / interval as f64;
    let mut burst = (mine - per_second(tokens, interval) * h).floor();
    if burst < 1.0 {
        burst = 1.0;
        (tokens, interval) = fill((mine - burst) / h);
    }
    Assignment::TokenBucket {
        max_tokens: burst.min(f64::from(u32::MAX)) as u32,
        tokens_per_fill: tokens.min(f64::from(u32::MAX)) as u32,
        fill_interval_secs: interval,
        ttl: token_bucket_ttl(room),
    }
}

/// The assignment of an Envoy whose instance shares the room with other Sluice instances,
/// `mine` its allowance: a tenth of it (at least one request) as burst, the rest as rate, and
/// `DENY_ALL` until the next report under one request. Each instance reads the others'
/// admissions a flush late, and this is the sizing the two-instance test with real Envoys
/// holds to 85% to 110% of the limit; deeper bursts (above) went to 132%, and the pace as rate
/// with a burst of one down to 80%.
fn shared(mine: f64, ttl: Duration) -> Assignment {
    if mine < 1.01 {
        return Assignment::DenyAll {
            ttl: ASSIGNMENT_TTL,
        };
    }
    let max_tokens = (mine / 10.0).floor().max(1.0);
    let (tokens, interval) = fill((mine - max_tokens) / REPORT_EVERY.as_secs_f64());
    Assignment::TokenBucket {
        max_tokens: max_tokens.min(f64::from(u32::MAX)) as u32,
        tokens_per_fill: tokens.min(f64::from(u32::MAX)) as u32,
        fill_interval_secs: interval,
        ttl,
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
            shared: false,
        }
    }

    #[test]
    fn no_rule_allows_all_for_long() {
        assert_eq!(assign(None, 0.5), Assignment::AllowAll);
        assert_eq!(Assignment::AllowAll.ttl(), UNLIMITED_TTL);
    }

    #[test]
    fn the_rate_is_the_pace_and_the_burst_half_the_room() {
        // 100 a 20 s window, all left: a pace of a quarter per 5 s report interval, and up to
        // half the room saved as burst.
        assert_eq!(pace(room(100, 20, 100, 20), REPORT_EVERY), 25.0);
        assert_eq!(allowance(room(100, 20, 100, 20), REPORT_EVERY), 75.0);
        // 30 left with 14 s to go: two more reports land in this window, 15 each.
        assert_eq!(pace(room(30, 14, 100, 20), REPORT_EVERY), 15.0);
        assert_eq!(allowance(room(30, 14, 100, 20), REPORT_EVERY), 30.0);
        // The last whole interval: all that is left, and never more.
        assert_eq!(pace(room(30, 9, 100, 20), REPORT_EVERY), 30.0);
        assert_eq!(allowance(room(30, 9, 100, 20), REPORT_EVERY), 30.0);
    }

    #[test]
    fn a_steady_demand_over_the_limit_is_admitted_the_limit_per_window() {
        // Reports 1 s after each 5 s mark of a 20 s window. A demand over the limit drains its
        // bucket, and a replacing bucket on the old one's clock starts about empty, so each
        // interval admits the rate: the pace. The last interval's usage happens in this
        // window and is counted in the next.
        let mut carried = 0.0;
        for _ in 0..10 {
            let mut remaining: f64 = 100.0 - carried;
            let mut admitted = 0.0;
            for reset in [19, 14, 9, 4] {
                let r = room(remaining.max(0.0) as u64, reset, 100, 20);
                let a = pace(r, REPORT_EVERY).floor();
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
    fn the_last_partial_interval_gets_the_next_windows_pace_within_this_ones_room() {
        // 2 s left: its report lands in the next window, at 5/s, but what it admits happens
        // in this one.
        assert_eq!(pace(room(30, 2, 100, 20), REPORT_EVERY), 25.0);
        assert_eq!(allowance(room(30, 2, 100, 20), REPORT_EVERY), 30.0);
        assert_eq!(pace(room(10, 2, 100, 20), REPORT_EVERY), 10.0);
        assert_eq!(allowance(room(10, 2, 100, 20), REPORT_EVERY), 10.0);
        assert!(matches!(
            assign(Some(room(30, 2, 100, 20)), 1.0),
            Assignment::TokenBucket { .. }
        ));
        assert_eq!(
            assign(Some(room(0, 2, 100, 20)), 1.0),
            Assignment::DenyAll {
                ttl: ASSIGNMENT_TTL
            }
        );
    }

    #[test]
    fn no_room_with_the_window_far_from_its_end_denies() {
        // Kept until the window allows more, and the next report: at least the usual TTL.
        let a = assign(Some(room(0, 12, 100, 20)), 1.0);
        assert_eq!(
            a,
            Assignment::DenyAll {
                ttl: ASSIGNMENT_TTL
            }
        );
        let a = assign(Some(room(0, 50, 100, 60)), 1.0);
        assert_eq!(a.ttl(), Duration::from_secs(55));
        let a = assign(Some(room(0, 86_000, 100, 86_400)), 1.0);
        assert_eq!(a.ttl(), UNLIMITED_TTL);
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
    fn an_assignment_is_the_pace_and_a_deep_burst() {
        // 1000 a minute, all left, one Envoy: a pace of 83.3 per interval, and up to 500
        // saved; 583.3 at most before the next report.
        let r = room(1000, 60, 1000, 60);
        let a = assign(Some(r), 1.0);
        let Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_secs,
            ..
        } = a
        else {
            panic!("expected a token bucket, got {a:?}");
        };
        let per_interval = f64::from(tokens_per_fill) / fill_interval_secs as f64 * 5.0;
        assert!((0.95 * 83.3..=83.4).contains(&per_interval), "{a:?}");
        let most = a.admits_at_most(REPORT_EVERY);
        assert!((0.99 * 583.3..=583.4).contains(&most), "{a:?}");
        assert!(max_tokens >= 490, "{a:?}");
        // Kept past its reports (a Sluice restart) for a window, it admits the pace, no
        // faster.
        assert_eq!(a.ttl(), Duration::from_secs(60));
        let over_ttl = a.admits_at_most(a.ttl()) - most;
        assert!(over_ttl <= 83.4 * 11.0, "{a:?}");
    }

    #[test]
    fn a_small_share_still_gets_a_burst_of_one() {
        // 2.4 allowed: a burst of one, the rest paced.
        let a = assign(Some(room(20, 60, 20, 60)), 0.24);
        assert!(
            matches!(
                a,
                Assignment::TokenBucket {
                    max_tokens: 1..,
                    ..
                }
            ),
            "{a:?}"
        );
        assert!(a.admits_at_most(REPORT_EVERY) <= 2.4, "{a:?}");
    }

    #[test]
    fn shares_split_the_allowance_by_demand() {
        let r = room(100, 20, 100, 20);
        let big = assign(Some(r), 0.9).admits_at_most(REPORT_EVERY);
        let small = assign(Some(r), 0.1).admits_at_most(REPORT_EVERY);
        assert!(big + small <= 75.0, "{big} + {small}");
        assert!(big > 5.0 * small, "{big} vs {small}");
    }

    #[test]
    fn a_drained_envoys_bucket_is_a_second_of_its_rate_deep() {
        let bucket = |max_tokens| Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill: 45,
            fill_interval_secs: 10,
            ttl: ASSIGNMENT_TTL,
        };
        // 4.5 a second: 5 deep, the same refill.
        let d = bucket(1).drained();
        assert_eq!(d, bucket(5));
        assert_eq!(d.refills(REPORT_EVERY), bucket(1).refills(REPORT_EVERY));
        // Deeper already: as it is; blanket rules too.
        assert_eq!(bucket(30).drained(), bucket(30));
        let deny = Assignment::DenyAll {
            ttl: ASSIGNMENT_TTL,
        };
        assert_eq!(deny.drained(), deny);
    }

    #[test]
    fn a_renewal_keeps_the_numbers() {
        let a = assign(Some(room(50, 12, 100, 20)), 1.0);
        let renewed = a.with_ttl(Duration::from_secs(33));
        assert_eq!(renewed.ttl(), Duration::from_secs(33));
        assert_eq!(
            renewed.admits_at_most(REPORT_EVERY),
            a.admits_at_most(REPORT_EVERY)
        );
        assert_eq!(
            Assignment::AllowAll.with_ttl(ASSIGNMENT_TTL),
            Assignment::AllowAll
        );
    }

    #[test]
    fn a_token_bucket_lives_until_its_window_ends_and_a_report_more() {
        let ttl = |reset, window| assign(Some(room(50, reset, 100, window)), 1.0).ttl();
        // At a window's start: a window (at least 20 s, at most an hour).
        assert_eq!(ttl(20, 20), ASSIGNMENT_TTL);
        assert_eq!(ttl(5, 5), ASSIGNMENT_TTL);
        assert_eq!(ttl(60, 60), Duration::from_secs(60));
        assert_eq!(ttl(86_400, 86_400), UNLIMITED_TTL);
        // Later: the rest of the window and a report interval, at least 20 s.
        assert_eq!(ttl(40, 60), Duration::from_secs(45));
        assert_eq!(ttl(10, 60), ASSIGNMENT_TTL);
        let mut shared = room(50, 60, 100, 60);
        shared.shared = true;
        assert_eq!(assign(Some(shared), 1.0).ttl(), Duration::from_secs(60));
    }

    #[test]
    fn less_than_one_request_denies() {
        // The room is there (2 of it now), this Envoy's share of it is not: the usual TTL.
        let a = assign(Some(room(4, 60, 10, 60)), 0.3);
        assert_eq!(
            a,
            Assignment::DenyAll {
                ttl: ASSIGNMENT_TTL
            }
        );
        // Less than one request for all of this instance's Envoys: until the window ends.
        let a = assign(Some(room(1, 60, 10, 60)), 0.5);
        assert_eq!(a.ttl(), Duration::from_secs(65));
    }
}
