//! Which assignments a report's answer carries: only those that changed materially, or that
//! would lapse before the next report has had a chance to renew them.
//!
//! Envoy keeps a bucket's token bucket when an assignment repeats its numbers (the protocol:
//! the same strategy only extends the active assignment's time to live), and makes a new one
//! for any other numbers; every action costs bytes on the stream and work in Envoy, and a
//! report needs no answer at all (answers are pushed on the stream when assignments change).
//! So a bucket's action is sent when its assignment is new, changes kind (token bucket,
//! `DENY_ALL`, `ALLOW_ALL`), changes its fill interval, or changes what it admits over a report
//! interval (`max_tokens` plus the rate over 5 s): up by more than [`MATERIAL`] of what the
//! previous one admitted, or down by more than [`MATERIAL_FALL`] (an Envoy kept on a larger
//! one admits more than the room it was sized for; on a smaller one, less); or when the
//! previous one has at most [`RENEW_WITHIN`] of its time to live left, so that it is renewed
//! one whole report interval before it would lapse (a late or lost report leaves Envoy on it).
//! A renewal repeats the numbers Envoy holds with the new time to live: Envoy keeps its
//! bucket, and Sluice knows what it holds (demand.rs counts a kept bucket as such). A time to
//! live alone (a token bucket's follows its window's end) is no change: sent at every report,
//! the small rises kept back reached Envoy, and a Sluice outage in the simulator went 25% to
//! 45% over. With a 20 s time to live and reports every 5 s, an unchanged assignment goes out
//! every other report.

use std::time::Duration;

use sluice_core::Nanos;

use super::sizing::{Assignment, REPORT_EVERY};

/// The smallest rise of what an assignment admits per report interval worth sending, as a
/// part of what the previous one admitted.
pub const MATERIAL: f64 = 0.1;

/// The smallest fall worth sending: Envoy keeping the larger one admits more than the room it
/// was sized for, so a fall is sent sooner than a rise.
pub const MATERIAL_FALL: f64 = 0.02;

/// An assignment with at most this much of its time to live left is renewed.
pub const RENEW_WITHIN: Duration = Duration::from_secs(2 * REPORT_EVERY.as_secs());

/// An assignment as last sent for a bucket, and when.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sent {
    /// What was sent.
    pub assignment: Assignment,
    /// When (the engine's clock).
    pub at: Nanos,
}

impl Sent {
    /// When Envoy drops it (the engine's clock).
    pub fn expires(&self) -> Nanos {
        let ttl = u64::try_from(self.assignment.ttl().as_nanos()).unwrap_or(u64::MAX);
        self.at.saturating_add(ttl)
    }
}

/// What a report's answer carries for a bucket whose assignment is now `next`, after
/// `previous` (none: never sent): `next` when it is new or changed materially, the numbers
/// Envoy holds with `next`'s time to live when they are due for renewal, or nothing.
pub fn answer(previous: Option<Sent>, next: Assignment, now: Nanos) -> Option<Assignment> {
    let Some(previous) = previous else {
        return Some(next);
    };
    if material(previous.assignment, next) {
        return Some(next);
    }
    (previous.expires().saturating_sub(now) <= RENEW_WITHIN.as_nanos() as u64)
        .then(|| previous.assignment.with_ttl(next.ttl()))
}

/// Whether `next` differs materially from `previous`.
fn material(previous: Assignment, next: Assignment) -> bool {
    match (previous, next) {
        (
            Assignment::TokenBucket {
                fill_interval_secs: a,
                ..
            },
            Assignment::TokenBucket {
                fill_interval_secs: b,
                ..
            },
        ) if a == b => {
            let (was, now) = (
                previous.admits_at_most(REPORT_EVERY),
                next.admits_at_most(REPORT_EVERY),
            );
            now > was * (1.0 + MATERIAL) || now < was * (1.0 - MATERIAL_FALL)
        }
        (Assignment::AllowAll, Assignment::AllowAll)
        | (Assignment::DenyAll { .. }, Assignment::DenyAll { .. }) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const DENY: Assignment = Assignment::DenyAll {
        ttl: super::super::sizing::ASSIGNMENT_TTL,
    };

    fn bucket(max_tokens: u32, tokens_per_fill: u32) -> Assignment {
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_secs: 10,
            ttl: super::super::sizing::ASSIGNMENT_TTL,
        }
    }

    /// Whether `next` must be sent at `now`, after `previous` (none: never sent).
    fn due(previous: Option<Sent>, next: Assignment, now: Nanos) -> bool {
        answer(previous, next, now).is_some()
    }

    fn sent(assignment: Assignment, at: Nanos) -> Option<Sent> {
        Some(Sent { assignment, at })
    }

    #[test]
    fn a_new_bucket_and_a_change_of_kind_are_sent() {
        assert!(due(None, DENY, 0));
        assert!(due(sent(bucket(2, 36), 0), DENY, S));
        assert!(due(sent(DENY, 0), bucket(2, 36), S));
        let slow = Assignment::TokenBucket {
            max_tokens: 2,
            tokens_per_fill: 36,
            fill_interval_secs: 60,
            ttl: super::super::sizing::ASSIGNMENT_TTL,
        };
        assert!(due(sent(bucket(2, 36), 0), slow, S));
    }

    #[test]
    fn small_changes_wait_and_large_ones_go() {
        // 2 + 36/10 x 5 = 20 a report interval; 21 is within a tenth, 23 is not.
        assert!(!due(sent(bucket(2, 36), 0), bucket(2, 38), 5 * S));
        assert!(due(sent(bucket(2, 36), 0), bucket(2, 42), 5 * S));
        // A fall is sent from 2% on: 19 is, 20 is not.
        assert!(due(sent(bucket(2, 36), 0), bucket(2, 34), 5 * S));
        assert!(!due(sent(bucket(2, 36), 0), bucket(2, 36), 5 * S));
        assert!(!due(sent(DENY, 0), DENY, 5 * S));
    }

    #[test]
    fn a_renewal_repeats_the_numbers_envoy_holds() {
        // A rise within a tenth is not sent; at the renewal, the held numbers go out with the
        // new time to live, so that Envoy keeps its bucket.
        let held = bucket(2, 36);
        let next = Assignment::TokenBucket {
            max_tokens: 2,
            tokens_per_fill: 38,
            fill_interval_secs: 10,
            ttl: std::time::Duration::from_secs(27),
        };
        assert_eq!(answer(sent(held, 0), next, 5 * S), None);
        let renewed = answer(sent(held, 0), next, 10 * S).expect("renewed");
        assert!(renewed.same_bucket(held), "{renewed:?}");
        assert_eq!(renewed.ttl(), std::time::Duration::from_secs(27));
        // A material change goes out as it is.
        let risen = bucket(2, 42);
        assert_eq!(answer(sent(held, 0), risen, 5 * S), Some(risen));
    }

    #[test]
    fn an_unchanged_assignment_is_renewed_a_report_interval_before_it_lapses() {
        let a = bucket(2, 36);
        let ttl = a.ttl().as_nanos() as Nanos;
        let renew = RENEW_WITHIN.as_nanos() as Nanos;
        assert!(!due(sent(a, 0), a, ttl - renew - 1));
        assert!(due(sent(a, 0), a, ttl - renew));
        // At the next report after a renewal, at least one report interval is left.
        assert!(renew >= 2 * REPORT_EVERY.as_nanos() as Nanos);
        assert!(due(sent(DENY, 0), DENY, ttl));
        // An allow-all of an hour is renewed too, ten seconds before it lapses.
        let hour = Assignment::AllowAll.ttl().as_nanos() as Nanos;
        assert!(!due(
            sent(Assignment::AllowAll, 0),
            Assignment::AllowAll,
            60 * S
        ));
        assert!(due(
            sent(Assignment::AllowAll, 0),
            Assignment::AllowAll,
            hour - renew
        ));
    }
}
