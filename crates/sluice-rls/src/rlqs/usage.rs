//! A usage report into the engine's counters, and the room left after it.
//!
//! Envoy has already admitted the requests it reports, so they are counted as requests of
//! their descriptor, through the same `Engine::check` every door uses: local, synced and
//! exact rules count them where they count RLS and `/v1/acquire` requests, and every door
//! shares one limit. A report is counted up to the room a look finds first, in one call;
//! should that call be refused (the room shrank meanwhile, or a synced rule's budget is
//! smaller than its count), in at most two halving parts more. The rest (an overshoot the
//! assignment was sized to prevent) is not counted and shows in
//! `sluice_rlqs_usage_total{result="uncounted"}`. So a usage costs at most five engine calls
//! whatever its `num_requests_allowed`, and the calls beyond the usual three (look, count,
//! look) are counted against the stream's pace ([`Recorded::calls`]).

use sluice_core::MAX_COST;
use sluice_engine::{Engine, EngineError, Outcome, RuleStatus, Verdict};

use super::sizing::{REPORT_EVERY, Room, allowance};

/// Most engine calls that count one bucket's report (the look before them and after them
/// aside).
const MAX_COUNTING_CALLS: u32 = 3;

/// What a report did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Requests counted.
    pub counted: u64,
    /// Requests the rules had no room for.
    pub uncounted: u64,
    /// The most limiting rule's room now (`None`: no rule limits the bucket).
    pub room: Option<Room>,
    /// Engine calls it took.
    pub calls: u32,
}

/// Counts `allowed` requests of the bucket's descriptor in `domain` and reads the room left.
pub async fn record(
    engine: &Engine,
    domain: &str,
    entries: &[(String, String)],
    allowed: u64,
) -> Result<Recorded, EngineError> {
    let descriptor = [entries];
    let mut calls = 1;
    let mut look = engine.check(domain, &descriptor, 0).await?;
    let mut left = allowed;
    if allowed > 0 {
        let fits = fits(&look).unwrap_or(allowed);
        let mut chunk = allowed.min(fits).min(MAX_COST);
        let mut counting = 0;
        while left > 0 && chunk > 0 && counting < MAX_COUNTING_CALLS {
            counting += 1;
            if engine.check(domain, &descriptor, chunk).await?.allowed {
                left -= chunk;
                chunk = chunk.min(left);
            } else {
                chunk /= 2;
            }
        }
        calls += counting + 1;
        look = engine.check(domain, &descriptor, 0).await?;
    }
    Ok(Recorded {
        counted: allowed - left,
        uncounted: left,
        room: room_of(&look),
        calls,
    })
}

/// Requests the bucket has room for, as RLS decides a request of its descriptor: every
/// enforcing rule's room, and of the `quota_mode` rules (soft limits: a request goes on while
/// one of them has room) the largest; shadow rules enforce nothing. `None`: no rule limits.
fn fits(verdict: &Verdict<'_>) -> Option<u64> {
    let (hard, soft) = limiting(verdict);
    let soft = soft.map(|s| s.map(|r| r.remaining).max().unwrap_or(0));
    hard.map(|r| r.remaining).chain(soft).min()
}

/// The room of the rule that allows the least over the next report interval, read as
/// [`fits`] reads the rules (of the quota-mode ones, the one that allows the most), or `None`
/// when no enforcing rule with a limit matched.
pub fn room_of(verdict: &Verdict<'_>) -> Option<Room> {
    let by_allowance =
        |a: &Room, b: &Room| allowance(*a, REPORT_EVERY).total_cmp(&allowance(*b, REPORT_EVERY));
    let (hard, soft) = limiting(verdict);
    let soft = soft.and_then(|s| s.max_by(by_allowance));
    hard.chain(soft).min_by(by_allowance)
}

/// The rooms of the rules a bucket's requests must fit: the enforcing ones, and the
/// `quota_mode` ones apart (`None` when there are none).
fn limiting<'v>(
    verdict: &'v Verdict<'_>,
) -> (
    impl Iterator<Item = Room> + 'v,
    Option<impl Iterator<Item = Room> + 'v>,
) {
    let rooms = move |quota: bool| {
        verdict
            .statuses
            .iter()
            .filter(move |s| !s.shadow && s.quota_mode == quota)
            .filter(|s| !matches!(s.outcome, Outcome::ShadowDenied | Outcome::Unlimited))
            .filter_map(room)
    };
    let any_soft = verdict
        .statuses
        .iter()
        .any(|s| !s.shadow && s.quota_mode && s.limit.is_some());
    (rooms(false), any_soft.then(|| rooms(true)))
}

/// One rule's room (`None` without a limit).
fn room(s: &RuleStatus<'_>) -> Option<Room> {
    let (limit, window) = s.limit?;
    let over = matches!(
        s.outcome,
        Outcome::Denied | Outcome::CostExceedsLimit | Outcome::QuotaExceeded
    );
    Some(Room {
        remaining: if over { 0 } else { s.remaining },
        reset_after: match s.retry_after {
            Some(retry) if over => retry,
            _ => s.reset_after,
        },
        limit,
        window,
    })
}
