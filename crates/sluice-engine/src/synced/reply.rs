//! Reading a flush reply into a key's view of the others: their listed entries and the
//! counts no entry accounts for.

use sluice_core::Nanos;
use sluice_store::FlushOutcome;

use super::key_state::sat32;
use super::params::SyncedParams;
use super::shared::{Other, Others, Shared};
use super::time::{Demand, nanos_from_store_ms};

/// The unlisted group's demand: the average over the window so far, or, when this reply and
/// the last one in the window both had every other instance in the group (flushes that only
/// added their count), its growth since then if higher: a surge shows at once.
pub(super) fn unlisted_demand(
    p: &SyncedParams,
    shared: Option<&Shared>,
    outcome: &FlushOutcome,
    unlisted: u64,
    window_start: Nanos,
    now: Nanos,
) -> Demand {
    let recent = match shared.map(|x| x.others.as_slice()) {
        Some([o]) if outcome.entries.is_empty() && o.unlisted() && o.at > window_start => {
            unlisted.saturating_sub(o.count.into()) as f64 / now.saturating_sub(o.at).max(1) as f64
        }
        _ => 0.0,
    };
    let average = unlisted as f64 / now.saturating_sub(window_start).max(p.span_ns) as f64;
    Demand::from(average.max(recent))
}

/// The others a reply with entries lists, plus those known from the previous window that
/// have not flushed in this one yet. `unlisted`: whether the total holds counts no entry
/// accounts for (the group is then worked out afresh from it).
pub(super) fn listed_others(
    p: &SyncedParams,
    shared: &mut Option<Shared>,
    outcome: &FlushOutcome,
    node: &str,
    (window_start, now): (Nanos, Nanos),
    unlisted: bool,
) -> Others {
    // An entry already stale when the store answers belongs to an instance that left: drop
    // it, or the next window roll would re-date it and bring it back to life. After an outage
    // every entry is old: keep them.
    let grace = shared.as_ref().is_some_and(|x| x.in_grace(now));
    let fresh = |at: Nanos| grace || now.saturating_sub(at) <= 2 * p.span_ns;
    let mut others: Others = outcome
        .entries
        .iter()
        .filter(|e| &*e.node != node && fresh(nanos_from_store_ms(e.at_ms)))
        .map(|e| Other {
            node: e.node.clone(),
            count: sat32(e.count),
            at: nanos_from_store_ms(e.at_ms),
            demand: Demand::from_store_milli(e.rate_milli),
        })
        .collect();
    // Instances known from the previous window that have not flushed in this one yet keep
    // their carried demand until they go stale (one that did report, even stale, is judged
    // by its report above). So does the last window's unlisted group while the reply shows
    // nobody else at all (its instances have not flushed here yet; once one has, the group
    // would count it twice); otherwise the group is worked out afresh from the total.
    let nobody_else = !unlisted && outcome.entries.iter().all(|e| &*e.node == node);
    let known = shared.as_mut().map(|x| std::mem::take(&mut x.others));
    for o in known.into_iter().flatten() {
        let carried = if o.unlisted() {
            nobody_else
        } else {
            !outcome.entries.iter().any(|n| n.node == o.node)
        };
        if carried && o.at <= window_start {
            others.push(o);
        }
    }
    others
}
