//! A usage report into the engine's counters, and the room left after it.
//!
//! Envoy has already admitted the requests it reports, so they are counted as requests of
//! their descriptor, through the same `Engine::check` every door uses: local, synced and
//! exact rules count them where they count RLS and `/v1/acquire` requests, and every door
//! shares one limit. A report larger than the room is counted in halving parts until what is
//! left does not fit; the rest (an overshoot the assignment was sized to prevent) is not
//! counted and shows in `sluice_rlqs_uncounted_total`.

use sluice_core::MAX_COST;
use sluice_engine::{Engine, EngineError, Outcome, Verdict};

use super::sizing::{REPORT_EVERY, Room, allowance};

/// Most engine calls one bucket's report may take (halving a cost of `MAX_COST` to 1 and
/// back takes fewer).
const MAX_CALLS: u32 = 64;

/// What a report did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Requests counted.
    pub counted: u64,
    /// Requests the rules had no room for.
    pub uncounted: u64,
    /// The most limiting rule's room now (`None`: no rule limits the bucket).
    pub room: Option<Room>,
}

/// Counts `allowed` requests of the bucket's descriptor in `domain` and reads the room left.
pub async fn record(
    engine: &Engine,
    domain: &str,
    entries: &[(String, String)],
    allowed: u64,
) -> Result<Recorded, EngineError> {
    let descriptor = [entries];
    let mut left = allowed;
    let mut chunk = allowed.min(MAX_COST);
    let mut calls = 0;
    while left > 0 && chunk > 0 && calls < MAX_CALLS {
        calls += 1;
        if engine.check(domain, &descriptor, chunk).await?.allowed {
            left -= chunk;
            chunk = chunk.min(left);
        } else {
            chunk /= 2;
        }
    }
    let look = engine.check(domain, &descriptor, 0).await?;
    Ok(Recorded {
        counted: allowed - left,
        uncounted: left,
        room: room_of(&look),
    })
}

/// The room of the rule that allows the least over the next report interval, or `None` when
/// no enforcing rule with a limit matched.
pub fn room_of(verdict: &Verdict<'_>) -> Option<Room> {
    verdict
        .statuses
        .iter()
        .filter(|s| !matches!(s.outcome, Outcome::ShadowDenied | Outcome::Unlimited))
        .filter_map(|s| {
            let (limit, window) = s.limit?;
            let denied = matches!(s.outcome, Outcome::Denied | Outcome::CostExceedsLimit);
            Some(Room {
                remaining: if denied { 0 } else { s.remaining },
                reset_after: match s.retry_after {
                    Some(retry) if denied => retry,
                    _ => s.reset_after,
                },
                limit,
                window,
            })
        })
        .min_by(|a, b| allowance(*a, REPORT_EVERY).total_cmp(&allowance(*b, REPORT_EVERY)))
}
