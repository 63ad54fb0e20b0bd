//! A usage report into the engine's counters, and the room left after it.
//!
//! Envoy has already admitted the requests it reports, so they are counted as requests of
//! their descriptor where every door counts them: local, synced and exact rules, and every
//! door shares one limit. A bucket whose rules are all synced is recorded without a decision
//! (`Engine::record`): what Envoy let through is counted in full, and the key's demand (how
//! the instances split the room, `Engine::fleet_parts`) is what Envoy admitted, nothing more.
//! Other buckets go through the same `Engine::check` every door uses: counted up to the room
//! a look finds first, in one call; should that call be refused (the room shrank meanwhile),
//! in at most two halving parts more. The rest (an overshoot the assignment was sized to
//! prevent, or the usage of an Envoy on its fallback before its first assignment) was let
//! through all the same: synced rules record it (`sluice_rlqs_usage_total{result="over"}`,
//! as is what a record counts beyond the room); local and exact rules take no count without a
//! decision (`result="uncounted"`). So a usage costs at most six engine calls whatever its
//! `num_requests_allowed` (three for synced rules: look, record, look), and the calls beyond
//! the usual three are counted against the stream's pace ([`Recorded::calls`]). A synced
//! rule's room is the fleet's, by the estimate of its global count, with this instance's part
//! of it.

use sluice_core::MAX_COST;
use sluice_engine::{Engine, EngineError, FleetPart, Outcome, Reason, RuleStatus, Verdict};

use super::sizing::{REPORT_EVERY, Room, allowance};

/// Most engine calls that count one bucket's report (the look before them and after them
/// aside).
const MAX_COUNTING_CALLS: u32 = 3;

/// What a report did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recorded {
    /// Requests counted.
    pub counted: u64,
    /// Requests beyond the room, recorded without a decision.
    pub over: u64,
    /// Requests beyond the room that no rule records without a decision.
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
    let mut look = engine.check(domain, &descriptor, 0).await?;
    let mut parts = engine.fleet_parts(domain, entries);
    let mut counted = Counted {
        left: allowed,
        over: 0,
        calls: 1,
    };
    if allowed > 0 {
        let fits = fits(&look, &parts).unwrap_or(allowed);
        // Synced rules alone: recorded, not decided. A count the decision refuses (this
        // instance's budget is for its own requests until its next flush) would still add to
        // the key's demand, and the instances' demands are how they split the room: an
        // instance whose Envoys outran its budget would take a larger part for it, and more
        // the next time (measured: shares swinging 30:70 on an even split).
        let synced_only = !parts.is_empty() && parts.iter().all(|p| p.room.is_some());
        if synced_only {
            counted.record(engine, domain, entries, fits)?;
        } else {
            counted.decide(engine, domain, (entries, fits)).await?;
            if counted.left > 0 {
                // Let through all the same: the counters must hold it.
                counted.record(engine, domain, entries, 0)?;
            }
        }
        counted.calls += 1;
        look = engine.check(domain, &descriptor, 0).await?;
        parts = engine.fleet_parts(domain, entries);
    }
    Ok(Recorded {
        counted: allowed - counted.left - counted.over,
        over: counted.over,
        uncounted: counted.left,
        room: room_of(&look, &parts),
        calls: counted.calls,
    })
}

/// A report's count in progress: what is left to count, what was recorded beyond the room,
/// and the engine calls so far.
struct Counted {
    left: u64,
    over: u64,
    calls: u32,
}

impl Counted {
    /// Counts up to `fits` of what is left through the decision (as any door's requests): one
    /// call, at most two halvings more if it is refused.
    async fn decide(
        &mut self,
        engine: &Engine,
        domain: &str,
        (entries, fits): (&[(String, String)], u64),
    ) -> Result<(), EngineError> {
        let descriptor = [entries];
        let mut chunk = self.left.min(fits).min(MAX_COST);
        let mut counting = 0;
        while self.left > 0 && chunk > 0 && counting < MAX_COUNTING_CALLS {
            counting += 1;
            if engine.check(domain, &descriptor, chunk).await?.allowed {
                self.left -= chunk;
                chunk = chunk.min(self.left);
            } else {
                chunk /= 2;
            }
        }
        self.calls += counting;
        Ok(())
    }

    /// Records what is left without a decision (at most `MAX_COST` at once, as any cost: a
    /// report beyond it is an Envoy that lies, and its excess is dropped), where a rule takes
    /// it; of it, what is beyond `fits` counts as over the room.
    fn record(
        &mut self,
        engine: &Engine,
        domain: &str,
        entries: &[(String, String)],
        fits: u64,
    ) -> Result<(), EngineError> {
        let n = self.left.min(MAX_COST);
        self.calls += 1;
        if engine.record(domain, entries, n)? > 0 {
            self.left -= n;
            self.over += n.saturating_sub(fits);
        }
        Ok(())
    }
}

/// Requests the bucket has room for, as RLS decides a request of its descriptor: every
/// enforcing rule's room, and of the `quota_mode` rules (soft limits: a request goes on while
/// one of them has room) the largest; shadow rules enforce nothing. `None`: no rule limits.
fn fits(verdict: &Verdict<'_>, parts: &[FleetPart]) -> Option<u64> {
    let (hard, soft) = limiting(verdict, parts);
    let soft = soft.map(|s| s.map(|r| r.remaining).max().unwrap_or(0));
    hard.map(|r| r.remaining).chain(soft).min()
}

/// The room of the rule that allows this instance the least over the next report interval
/// (its part of the rule's allowance), read as
/// [`fits`] reads the rules (of the quota-mode ones, the one that allows the most), or `None`
/// when no enforcing rule with a limit matched.
pub fn room_of(verdict: &Verdict<'_>, parts: &[FleetPart]) -> Option<Room> {
    let mine = |r: &Room| allowance(*r, REPORT_EVERY) * r.part;
    let by_allowance = |a: &Room, b: &Room| mine(a).total_cmp(&mine(b));
    let (hard, soft) = limiting(verdict, parts);
    let soft = soft.and_then(|s| s.max_by(by_allowance));
    hard.chain(soft).min_by(by_allowance)
}

/// The rooms of the rules a bucket's requests must fit: the enforcing ones, and the
/// `quota_mode` ones apart (`None` when there are none).
fn limiting<'v>(
    verdict: &'v Verdict<'_>,
    parts: &'v [FleetPart],
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
            .filter_map(|s| room(s, parts))
    };
    let any_soft = verdict
        .statuses
        .iter()
        .any(|s| !s.shadow && s.quota_mode && s.limit.is_some());
    (rooms(false), any_soft.then(|| rooms(true)))
}

/// One rule's room (`None` without a limit), and this instance's part of it. A synced rule
/// whose look was refused on the estimate has the fleet's room its estimate leaves: a look
/// finding this instance's budget spent answers no room at all, while the budget is for
/// this instance's own requests until its next flush, not for what its Envoys may admit.
fn room(s: &RuleStatus<'_>, parts: &[FleetPart]) -> Option<Room> {
    let (limit, window) = s.limit?;
    let fleet = parts.iter().find(|p| &*p.rule_id == s.rule_id);
    let over = matches!(
        s.outcome,
        Outcome::Denied | Outcome::CostExceedsLimit | Outcome::QuotaExceeded
    );
    let estimated = s.reason == Some(Reason::Estimate);
    let (remaining, reset_after) = match (fleet.and_then(|p| p.room), s.retry_after) {
        (Some(room), _) if over && estimated => (room, s.reset_after),
        (_, Some(retry)) if over => (0, retry),
        _ if over => (0, s.reset_after),
        _ => (s.remaining, s.reset_after),
    };
    Some(Room {
        remaining,
        reset_after,
        limit,
        window,
        part: fleet.map_or(1.0, |p| p.part),
        shared: fleet.is_some_and(|p| p.shared),
    })
}
