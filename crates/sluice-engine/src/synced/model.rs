//! The predictive model's arithmetic, as pure functions of a key's state (what it reads of
//! one: [`KeyView`]): the fallback share,
//! the estimate of the global count, whether a shared key is far below its limit, this
//! instance's demand share and its budget.

use sluice_core::Nanos;

use super::params::SyncedParams;
use super::shared::{Budget, Other, Shared};
use super::time::Demand;
use crate::health::StoreHealth;

/// What the model reads of a key's state (a copy: the model knows no `KeyState`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyView {
    /// Admitted here in the current window.
    pub local: u32,
    /// The others' part of the window total read at the last flush.
    pub others_read: u32,
    /// The previous window's global total.
    pub prev_global: u32,
    /// The previous window's count here.
    pub prev_local: u32,
    /// This instance's demand for the key.
    pub demand: Demand,
    /// Whether the key's sharing is settled (no instance left unlisted).
    pub settled: bool,
}

/// Whether `cost` more fits one instance's share of the limit when `parties` instances split
/// it and none knows the others' counts (the store is unreachable, or a key's first span):
/// at most MAX/(parties x spans) in this span, rounded up so that a limit smaller than
/// `parties x spans` still admits one per span instead of nothing, and at most MAX/parties
/// (rounded up) in the window, so the rounding never adds up to more than the share. A
/// request costing more than the span's share fits when it is the span's first: otherwise a
/// cost above it (a gateway route costing 5 against a share of 3) would be refused until the
/// store answers, and the window's share still bounds what all instances admit.
pub(crate) fn fits_share(
    p: &SyncedParams,
    parties: u64,
    span_count: u64,
    window_count: u64,
    cost: u64,
) -> bool {
    let parties = parties.max(1);
    let per_span = p.limit.div_ceil(parties.saturating_mul(p.spans.max(1)));
    let per_window = p.limit.div_ceil(parties);
    (span_count + cost <= per_span || span_count == 0) && window_count + cost <= per_window
}

/// The seed's node estimate: the previous window's global count over this instance's, at
/// least 1.
pub(crate) fn node_estimate(key: &KeyView) -> u64 {
    if key.prev_local == 0 {
        return 1;
    }
    u64::from(key.prev_global / key.prev_local).max(1)
}

/// Instances that may be counting the key without this one knowing: until whether the key is
/// shared is settled (two replies to span-boundary flushes, or one listing the whole fleet),
/// the fleet's instances no reply has listed yet. Instances that flush at the same boundary
/// as this one are missing from its reply when theirs land after it; each is taken to do what
/// this instance does (its count, its demand) until a reply shows it.
pub(crate) fn phantoms(
    p: &SyncedParams,
    key: &KeyView,
    shared: Option<&Shared>,
    now: Nanos,
    fleet: u64,
) -> u64 {
    if key.settled || !p.predictive() {
        return 0;
    }
    let parties = fleet.max(p.expected_instances).max(1);
    let listed = shared.map_or(0, |x| x.live_others(p, now).count() as u64);
    parties.saturating_sub(1 + listed)
}

/// Predictive estimate of the global count in the key's window at `now`; `phantoms`
/// instances nobody listed yet are taken to have counted what this one has, and another
/// instance whose demand is not known yet (its entry was written after a single hit) to
/// demand what this one does, as [`share_with`] takes it.
pub(crate) fn estimate(
    p: &SyncedParams,
    key: &KeyView,
    shared: Option<&Shared>,
    window_start: Nanos,
    now: Nanos,
    (health, phantoms): (StoreHealth, u64),
) -> f64 {
    estimate_with(
        p,
        key,
        shared,
        (window_start, now),
        (health, phantoms),
        None,
    )
}

/// While the store does not answer, how much faster than their last known demand the others
/// are taken to grow. Their rates are measured over a span (a few tens of requests per
/// instance: 15-20% noise) and extrapolated for as long as the outage lasts, with nothing to
/// correct them: at their rates alone, a 30 s outage at 2x the limit went up to 8.0% over in a
/// window (`outage.yaml` over seeds 1-10; 3.3% with the margin, some windows admitting 89% of
/// the limit). An outage errs towards refusing: the limit protects something.
const OUTAGE_DEMAND_MARGIN: f64 = 1.2;

/// [`estimate`], the others whose news is older than this instance's own counted as `floor`
/// says.
fn estimate_with(
    p: &SyncedParams,
    key: &KeyView,
    shared: Option<&Shared>,
    (window_start, now): (Nanos, Nanos),
    (health, phantoms): (StoreHealth, u64),
    floor: Option<Floor>,
) -> f64 {
    let mut others = phantoms as f64 * f64::from(key.local);
    if let Some(shared) = shared {
        for o in &shared.others {
            others += f64::from(o.count);
            // An entry not refreshed for two spans belongs to an instance that left; while
            // the store is silent nobody refreshes, so entries do not go stale then.
            if !health.answering() || shared.live(p, o, now) {
                let demand = if o.demand.is_none() && !o.unlisted() {
                    key.demand
                } else {
                    o.demand
                };
                let mut from = if health.answering() {
                    shared.quiet_until(p, o)
                } else {
                    o.at
                };
                let demand = match floor.and_then(|f| f.least(p, key, o, now)) {
                    Some((since, least)) => {
                        from = from.min(since);
                        demand.per_ns().max(least)
                    }
                    None => demand.per_ns(),
                };
                let margin = if health.answering() {
                    1.0
                } else {
                    OUTAGE_DEMAND_MARGIN
                };
                others += margin * demand * now.saturating_sub(from.max(window_start)) as f64;
            }
        }
    }
    let local = f64::from(key.local);
    // What this instance knows for sure: the total it read (its own count at that moment
    // included) plus what it admitted since.
    (local + others).max(local + f64::from(key.others_read))
        + previous_weight(p, key, window_start, now)
}

/// With a sliding window, the previous window's total weighted by the part of it the window
/// still covers at `now`; nothing otherwise.
fn previous_weight(p: &SyncedParams, key: &KeyView, window_start: Nanos, now: Nanos) -> f64 {
    if !p.sliding {
        return 0.0;
    }
    let elapsed = now.saturating_sub(window_start).min(p.window_ns);
    f64::from(key.prev_global) * (1.0 - elapsed as f64 / p.window_ns as f64)
}

/// The window's count as this instance read it: its own, the phantoms' taken as its own, and
/// the others' as their entries and the last total read them, nothing extrapolated.
fn read_count(
    p: &SyncedParams,
    key: &KeyView,
    shared: &Shared,
    window_start: Nanos,
    now: Nanos,
    phantoms: u64,
) -> f64 {
    let local = f64::from(key.local);
    let listed: f64 = shared.others.iter().map(|o| f64::from(o.count)).sum();
    (local * (1 + phantoms) as f64 + listed).max(local + f64::from(key.others_read))
        + previous_weight(p, key, window_start, now)
}

/// Whether a shared key is far below its limit: the estimate, grown for two more spans at
/// the key's known demand (this instance's and every live other's), stays under half the
/// limit. Such a key needs no entries until it nears the limit: the total `INCRBY` returns
/// bounds the estimate from below, and the others count as one unlisted group meanwhile.
pub(crate) fn far_below(
    p: &SyncedParams,
    key: &KeyView,
    shared: &Shared,
    window_start: Nanos,
    now: Nanos,
    phantoms: u64,
) -> bool {
    if shared.in_grace(now) {
        // After an outage the entries are what tells the others' counts on their way.
        return false;
    }
    let (estimate, growth) =
        estimate_and_growth(p, key, shared, (window_start, now), phantoms, 2 * p.span_ns);
    estimate + growth < p.limit as f64 / 2.0
}

/// The key's estimate now and how much it grows in `reach` more nanoseconds at its known
/// demand (this instance's, the phantoms' taken as its own, and every live other's), both in
/// requests (rates per nanosecond times nanoseconds).
fn estimate_and_growth(
    p: &SyncedParams,
    key: &KeyView,
    shared: &Shared,
    (window_start, now): (Nanos, Nanos),
    phantoms: u64,
    reach: Nanos,
) -> (f64, f64) {
    let rate = key.demand.per_ns() * (1 + phantoms) as f64
        + shared
            .live_others(p, now)
            .map(|o| o.demand.per_ns())
            .sum::<f64>();
    let estimate = estimate(
        p,
        key,
        Some(shared),
        window_start,
        now,
        (StoreHealth::Answering, phantoms),
    );
    (estimate, rate * reach as f64)
}

/// Whether the key's estimate at its window's end, grown at its known demand (this
/// instance's, the phantoms' taken as its own, and every live other's), stays within the
/// limit. Then a share by demand is raised to an even part of the room at least
/// ([`share_with`]): a demand is measured over a span, a handful of requests for a user at
/// half its limit on 12 s windows (0.6-2 a second on instances that each met 1 a second),
/// and a share by that demand of a tenth gave an instance 5 requests for a 2 s span;
/// arrivals clumping past it were refused with half the window's room unused
/// (`mix/short.yaml` over 24 draws: normal users' false denials up to 0.19%, 0.11% with the
/// floor).
fn within_limit_at_window_end(
    p: &SyncedParams,
    key: &KeyView,
    shared: &Shared,
    (window_start, now): (Nanos, Nanos),
    phantoms: u64,
) -> bool {
    let to_end = (window_start + p.window_ns).saturating_sub(now);
    let (estimate, growth) =
        estimate_and_growth(p, key, shared, (window_start, now), phantoms, to_end);
    estimate + growth <= p.limit as f64
}

/// Whether a key under its limit may reach it within two spans at its known demand: then a
/// boundary reply that may have come before the others' flushes of the boundary is worth a
/// second read once they have landed. A key already at its limit is not: a read tells it
/// nothing it can admit. (Two spans even near a fixed window's end: the rates lag a climbing
/// demand, and capped at the window's end the reach missed a tenant's first window, 12.3% over
/// where it is 9.3%.)
pub(crate) fn nears_limit(
    p: &SyncedParams,
    key: &KeyView,
    shared: &Shared,
    (window_start, now): (Nanos, Nanos),
    phantoms: u64,
) -> bool {
    let (estimate, growth) =
        estimate_and_growth(p, key, shared, (window_start, now), phantoms, 2 * p.span_ns);
    let limit = p.limit as f64;
    estimate < limit && estimate + growth >= limit
}

/// Others whose news is older than this instance's own, counted with at least a demand like
/// its own.
#[derive(Clone, Copy, Debug)]
enum Floor {
    /// At an early reply to a key's cold start ([`Split::ColdStart`]): those listed and last
    /// heard of before `before` demand at least what this instance does.
    Listed { before: Nanos },
    /// At a boundary reply that may have come before the others' flushes of the boundary
    /// ([`Split::Behind`]): the unlisted group's count is as of the boundary before,
    /// `boundary` less a span, and it grew since as this instance did, in proportion to their
    /// counts then, at most as its `instances` would each growing as this one did.
    Group { boundary: Nanos, instances: u64 },
}

impl Floor {
    /// For `o`, when this floor counts it: from when its count is extrapolated, and the least
    /// demand it is taken to have.
    fn least(self, p: &SyncedParams, key: &KeyView, o: &Other, now: Nanos) -> Option<(Nanos, f64)> {
        let own = key.demand.per_ns();
        match self {
            Floor::Listed { before } if !o.unlisted() && o.at < before => Some((o.at, own)),
            Floor::Group {
                boundary,
                instances,
            } if o.unlisted() => {
                let then = boundary.saturating_sub(p.span_ns);
                let own_then = f64::from(key.local) - key.demand.hits_in(now.saturating_sub(then));
                let ratio = (f64::from(o.count) / own_then.max(1.0)).min(instances as f64);
                Some((then, own * ratio))
            }
            _ => None,
        }
    }
}

/// This instance's share of the key's demand: its demand over all live instances' (and the
/// stale ones' the fleet has room for), the phantoms' taken as its own, the others counted as
/// `floor` says; with `even`, at least that part ([`within_limit_at_window_end`]). A demand not known yet (a single hit so far) is taken to be like the others':
/// this instance's for another instance, the average of the known ones for this instance (an
/// even split when none is known), so that nobody takes the whole room, or none of it, for
/// want of a rate.
fn share_with(
    p: &SyncedParams,
    key: &KeyView,
    shared: &Shared,
    now: Nanos,
    (phantoms, fleet): (u64, u64),
    (floor, even): (Option<Floor>, Option<f64>),
) -> f64 {
    let known = |d: super::time::Demand| (!d.is_none()).then(|| d.per_ns());
    let own_known = known(key.demand);
    // An instance whose entry went stale (nothing from it for two spans) may have left, or
    // gone quiet and be about to come back with everyone else (a client behind a balancer
    // bursts on every instance at once): while the fleet has room for it, its part of the
    // room is kept as for an instance whose demand is not known.
    let live = shared.live_others(p, now).count() as u64;
    let stale = (shared.others.len() as u64 - live).min(fleet.saturating_sub(1 + phantoms + live));
    let others: Vec<Option<f64>> = shared
        .live_others(p, now)
        .map(|o| match (known(o.demand), own_known, floor) {
            (Some(rate), Some(_), Some(f)) => Some(
                f.least(p, key, o, now)
                    .map_or(rate, |(_, least)| rate.max(least)),
            ),
            (rate, ..) => rate,
        })
        .chain((0..stale).map(|_| None))
        .collect();
    let (sum, n) = others
        .iter()
        .flatten()
        .fold((0.0, 0.0), |(sum, n), r| (sum + r, n + 1.0));
    let own = own_known.unwrap_or(if n > 0.0 { sum / n } else { 1.0 });
    let total = own * (1 + phantoms) as f64 + others.iter().map(|r| r.unwrap_or(own)).sum::<f64>();
    let Some(even) = even else {
        return (own / total).clamp(0.0, 1.0);
    };
    // Not scaled back to add up to one (docs/ACCURACY.md: a pinned client lost windows).
    ((own / total).max(even)).clamp(0.0, 1.0)
}

/// An even part of the room: one over the fleet the store counts (at least the instances this
/// one knows of: itself, the phantoms, the live others listed, and the unlisted group when no
/// other is listed). With others listed, the group's counts may be theirs (flushes that only
/// added a count): counted as one more instance besides, two of five instances took a sixth
/// of the room each at a surge, and the window admitted 280 of 300.
fn even_share(p: &SyncedParams, shared: &Shared, now: Nanos, (phantoms, fleet): (u64, u64)) -> f64 {
    let listed = shared.live_others(p, now).filter(|o| !o.unlisted()).count() as u64;
    let group = listed == 0 && shared.live_others(p, now).any(Other::unlisted);
    let known = 1 + phantoms + listed + u64::from(group);
    1.0 / fleet.max(p.expected_instances).max(known) as f64
}

/// How far above its average over the window so far a key's demand here is when it counts as
/// climbing ([`ramping`]).
const RAMP: f64 = 1.25;

/// Whether this instance's demand for the key is climbing: its rate now [`RAMP`] times its
/// average over the window so far or more. Only then is the unlisted group, read a span
/// behind, taken to have grown as this instance did ([`Floor::Group`]): on a steady key its
/// count, maybe fresh, grew by a span more than it did, and a user at half its limit was
/// refused with half the window's room unused (`mix/five.yaml`: 4 false denials of 29,598).
fn ramping(key: &KeyView, window_start: Nanos, now: Nanos) -> bool {
    let elapsed = now.saturating_sub(window_start);
    elapsed > 0 && key.demand.per_ns() > RAMP * f64::from(key.local) / elapsed as f64
}

/// How a budget splits the room among the instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Split {
    /// By demand ([`share_with`]): at a flush reply, when the rates are as fresh as they get.
    ByDemand,
    /// Evenly over the fleet: a key quiet at the last boundary (no reply in this span) whose
    /// first request of the span sets the budget. Every rate it holds, its own and the
    /// others', is as old as the quiet, and each instance's is of a different age, so shares
    /// by demand do not add up to one: a client quiet between bursts bursts on every instance
    /// at once, and each instance then took its own stale share (a burst once a minute after a
    /// trickle of 0.2/s: budgets adding up to 55% of the room, windows at 67%). The room is
    /// what it read, nothing extrapolated: a burst's rate carried over the quiet took most of
    /// the room before the next burst. Evenly, every instance that meets the burst takes the
    /// same part and the parts add up to the room.
    Even,
    /// By demand at an early reply to a key's cold start: this instance spent its cold share
    /// before any reply with entries, and the others listed may hold budgets it cannot see.
    /// Those last heard of more than a quarter span ago count with at least this instance's
    /// demand (their rates are from before its own burst: a client trickling, then bursting
    /// on every instance at once, had them at a trickle's while each held its part of the
    /// room).
    ColdStart,
    /// By demand at a span boundary's reply that may have come before the others' flushes of
    /// the same boundary, the others partly shown as the unlisted group (instances that only
    /// add their count: a key far below its limit, as its instances last judged). The group's
    /// count is then a span old, and its demand the average of the window so far: it counts
    /// from the boundary before, growing at least as this instance did ([`Floor::Group`]),
    /// when this instance's demand climbs ([`ramping`]).
    /// Taken as current, a tenant's key whose users arrive over a window (`mix/five.yaml`)
    /// had the first replies of a boundary take budgets from a room twice the size left (a
    /// window at 324 of 300).
    Behind,
}

/// This instance's budget until its next flush reply: its share of the room the estimate
/// leaves in the window. Only keys with others have one: alone, the share is 1 and the budget
/// check is the estimate check.
pub(crate) fn budget(
    p: &SyncedParams,
    key: &KeyView,
    shared: &Shared,
    (window_start, now): (Nanos, Nanos),
    (phantoms, fleet): (u64, u64),
    split: Split,
) -> Budget {
    let floor = match split {
        Split::ColdStart => Some(Floor::Listed {
            before: now.saturating_sub(p.settle_margin()),
        }),
        Split::Behind if ramping(key, window_start, now) => Some(Floor::Group {
            boundary: p.span_of(now).saturating_mul(p.span_ns),
            instances: {
                let listed = shared.live_others(p, now).filter(|o| !o.unlisted()).count() as u64;
                fleet.saturating_sub(1 + phantoms + listed).max(1)
            },
        }),
        Split::Behind | Split::ByDemand | Split::Even => None,
    };
    let answering = (StoreHealth::Answering, phantoms);
    let counted = match split {
        Split::ByDemand | Split::ColdStart => {
            estimate(p, key, Some(shared), window_start, now, answering)
        }
        Split::Behind => estimate_with(p, key, Some(shared), (window_start, now), answering, floor),
        Split::Even => read_count(p, key, shared, window_start, now, phantoms),
    };
    let room = (p.limit as f64 - counted).max(0.0);
    // A key far below its limit flushes only its count and learns of the others as one
    // unlisted group; how that group's demand is spread over its instances is not known, each
    // instance sees a different part of it (a reply that lands before the others' flushes of
    // the same boundary reads a total without them), and its own rate is a trickle's. Shares
    // by demand then added up to anywhere from half to one and a half of the room when a
    // burst came on every instance at once (`mix/surge.yaml`: 383 of 300). Evenly, the parts
    // add up to the room whatever order the replies came in; far below, an even part is more
    // than a span of the key's demand on any instance.
    let even = split == Split::Even || far_below(p, key, shared, window_start, now, phantoms);
    let share = if even {
        even_share(p, shared, now, (phantoms, fleet))
    } else {
        // Not at a cold start's early reply (the others listed may hold budgets this reply
        // cannot see), nor after an outage (their counts from the gap are on their way), nor
        // while a live other's demand is unknown (the growth would leave it out).
        let floored = split != Split::ColdStart
            && p.shareable(fleet.max(p.expected_instances))
            && !shared.in_grace(now)
            && shared.live_others(p, now).all(|o| !o.demand.is_none())
            && within_limit_at_window_end(p, key, shared, (window_start, now), phantoms);
        let even = floored.then(|| even_share(p, shared, now, (phantoms, fleet)));
        share_with(p, key, shared, now, (phantoms, fleet), (floor, even))
    };
    Budget {
        // `room` is at most the limit, a 32-bit count (the cast saturates anyway).
        amount: (room * share).floor() as u32,
        local_at: key.local,
        share: share as f32,
        at: now,
        even,
        ..Budget::default()
    }
}

/// The budget at `now`: with a sliding window it grows as the previous window's weight decays.
pub(crate) fn budget_now(
    p: &SyncedParams,
    key: &KeyView,
    budget: &Budget,
    window_start: Nanos,
    now: Nanos,
) -> u64 {
    if !p.sliding {
        return budget.amount.into();
    }
    // The decay since the budget was set, within this window.
    let from = budget.at.max(window_start);
    let freed = f64::from(key.prev_global) * now.saturating_sub(from) as f64 / p.window_ns as f64;
    u64::from(budget.amount) + (freed * f64::from(budget.share)).floor() as u64
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_config::Policy;

    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn while_the_store_is_silent_the_others_grow_faster_than_their_last_rate() {
        let p = SyncedParams {
            limit: 100,
            window_ns: 60 * SECOND,
            spans: 4,
            span_ns: 15 * SECOND,
            cooldown_ns: 0,
            policy: Policy::Predictive,
            sliding: false,
            expected_instances: 1,
        };
        let window_start = 1_000 * p.window_ns;
        // The other instance flushed at a span boundary: 20 admitted, 2 a second.
        let flushed = window_start + p.span_ns;
        let key = KeyView {
            local: 10,
            others_read: 0,
            prev_global: 0,
            prev_local: 0,
            demand: Demand::from_store_milli(1_000),
            settled: true,
        };
        let mut shared = Shared::heard_at(flushed);
        shared.others.push(Other {
            node: Arc::from("b"),
            at: flushed,
            count: 20,
            demand: Demand::from_store_milli(2_000),
        });
        let now = flushed + 10 * SECOND;
        let at = |health| estimate(&p, &key, Some(&shared), window_start, now, (health, 0));
        // Its own 10, the other's 20, and 10 s of the other's 2 a second: at that rate, and
        // 1.2x it while the store does not answer.
        assert!((at(StoreHealth::Answering) - 50.0).abs() < 0.01);
        assert!((at(StoreHealth::Unreachable) - 54.0).abs() < 0.01);
    }

    #[test]
    fn a_budget_by_demand_is_an_even_part_at_least_while_the_window_ends_within_the_limit() {
        // 120 per 12 s window, 2 s spans, five instances that each counted 8 by a boundary
        // 4 s in (a room of 80); this one measured its demand at 0.6 a second.
        let p = SyncedParams {
            limit: 120,
            window_ns: 12 * SECOND,
            spans: 6,
            span_ns: 2 * SECOND,
            cooldown_ns: 0,
            policy: Policy::Predictive,
            sliding: false,
            expected_instances: 5,
        };
        let window_start = 1_000 * p.window_ns;
        let now = window_start + 4 * SECOND;
        let key = KeyView {
            local: 8,
            others_read: 32,
            prev_global: 0,
            prev_local: 0,
            demand: Demand::from_store_milli(600),
            settled: true,
        };
        let budget_with = |others_milli: u64| {
            let mut shared = Shared::heard_at(now);
            for node in ["b", "c", "d", "e"] {
                shared.others.push(Other {
                    node: Arc::from(node),
                    at: now,
                    count: 8,
                    demand: Demand::from_store_milli(others_milli),
                });
            }
            budget(
                &p,
                &key,
                &shared,
                (window_start, now),
                (0, 5),
                Split::ByDemand,
            )
        };
        // The others at 1.2 a second: the window ends at about 83 of 120 at these rates. By
        // demand this instance's share is a ninth (8 of the 80); raised to a fifth, 16.
        let calm = budget_with(1_200);
        assert!(!calm.even);
        assert_eq!(calm.amount, 16, "{calm:?}");
        // The others at 3 a second: within the limit two spans on (about 90), over it at the
        // window's end (about 141): by demand, 0.6 of 12.6 a second, 3 of the 80.
        let busy = budget_with(3_000);
        assert_eq!(busy.amount, 3, "{busy:?}");
    }
}
