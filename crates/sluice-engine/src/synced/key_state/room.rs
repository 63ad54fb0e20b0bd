//! How much room a request has under the predictive policy: the estimate of the global count,
//! this instance's budget (split by demand, or evenly where rates say nothing), and when reading
//! the store is worth it before refusing on what this instance only assumes of the others.

use sluice_core::Nanos;

use super::super::model;
use super::super::params::SyncedParams;
use super::super::shared::{Budget, Read, SetAt, Shared};
use super::KeyState;
use crate::health::StoreView;

impl KeyState {
    /// When a read of the store is worth it before refusing `cost` more: when only what this
    /// instance assumes of the others leaves no room. That is the instances not listed yet
    /// (taken to count what this one does, while they may not count the key at all: a client
    /// pinned here; a read settles them only a quarter span after the boundary, once its
    /// flushes have landed), or, when it has not heard of the key for a span, the others'
    /// demand since (an instance whose demand fell sends nothing to say so: a client quiet
    /// between bursts; not for a spent budget, which a burst on every instance spends at once:
    /// read again, each would take a new budget from a room the others' bursts already
    /// fill). Not for a limit too small to share among the fleet: each instance's cold share
    /// is a large part of it.
    fn worth_a_read(
        &self,
        p: &SyncedParams,
        shared: Option<&Shared>,
        (window_start, now): (Nanos, Nanos),
        (cost, phantoms, refusal): (u64, u64, &Refusal),
        store: StoreView,
    ) -> Option<Nanos> {
        if !store.health.answering() || !p.shareable(store.fleet.max(p.expected_instances)) {
            return None;
        }
        let fits = |count: f64| count + cost as f64 <= p.limit as f64;
        let unheard = shared.is_some_and(|x| now.saturating_sub(x.heard_at) >= p.span_ns);
        if unheard && matches!(refusal, Refusal::Limit) && fits(self.read(shared)) {
            return Some(now);
        }
        let without_unlisted = model::estimate(
            p,
            &self.view(),
            shared,
            window_start,
            now,
            (store.health, 0),
        );
        (phantoms > 0 && fits(without_unlisted))
            .then(|| now.max(p.span_of(now).saturating_mul(p.span_ns) + p.settle_margin()))
    }

    /// The window's count as this instance read it: its own, and the others' as their
    /// entries and the last total read them (nothing extrapolated).
    fn read(&self, shared: Option<&Shared>) -> f64 {
        let listed: f64 = shared.map_or(0.0, |x| x.others.iter().map(|o| f64::from(o.count)).sum());
        (f64::from(self.local) + listed).max(f64::from(self.local) + f64::from(self.others_read))
    }

    /// Whether the policy has room for `cost` more: predictive, the estimate of the global
    /// count (and, for a shared key, this instance's budget); reactive, its own count scaled by
    /// the node estimate. Returns the count the room was judged against.
    pub(super) fn room_for(
        &self,
        p: &SyncedParams,
        mut shared: Option<&mut Shared>,
        window_start: Nanos,
        now: Nanos,
        cost: u64,
        store: StoreView,
    ) -> Result<u64, Refusal> {
        let local = u64::from(self.local);
        if !p.predictive() {
            let nodes = model::node_estimate(&self.view());
            if (local + cost).saturating_mul(nodes) > p.limit {
                return Err(Refusal::Limit);
            }
            return Ok((local + u64::from(self.others_read)).max(local * nodes));
        }
        let phantoms = model::phantoms(p, &self.view(), shared.as_deref(), now, store.fleet);
        let estimate = model::estimate(
            p,
            &self.view(),
            shared.as_deref(),
            window_start,
            now,
            (store.health, phantoms),
        );
        let refusal = if estimate + cost as f64 > p.limit as f64 {
            Some(Refusal::Limit)
        } else if self.seen_entries()
            && let Some(shared) = shared.as_deref_mut()
            && !self.within_budget(p, shared, window_start, now, cost, (phantoms, store.fleet))
        {
            Some(Refusal::Budget)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            return Err(self
                .worth_a_read(
                    p,
                    shared.as_deref(),
                    (window_start, now),
                    (cost, phantoms, &refusal),
                    store,
                )
                .map_or(refusal, |from| Refusal::Unread { from }));
        }
        Ok(estimate.ceil() as u64)
    }

    /// Predictive, shared: whether `cost` more stays within this instance's budget (set now
    /// if the window has none yet: a new window before this instance's first reply in it).
    fn within_budget(
        &self,
        p: &SyncedParams,
        shared: &mut Shared,
        window_start: Nanos,
        now: Nanos,
        cost: u64,
        (phantoms, fleet): (u64, u64),
    ) -> bool {
        // A budget lasts until the next reply, due at the next span boundary; a key with
        // nothing to flush there got none, and the budget set for an earlier span would be
        // spent on a later one's demand (a burst after a quiet span): set it again.
        let budget = match shared.budget() {
            Some(budget) if p.span_of(budget.at) == p.span_of(now) => budget,
            _ => {
                // A key whose sharing is not settled yet (a new key: phantoms) splits by its
                // demand, the phantoms' taken as its own, as at its replies; so does a limit
                // too small to share (`small_limits: share`), where the requests the others
                // admitted since their last flush are a large part of the room.
                let split = if phantoms == 0 && p.shareable(fleet.max(p.expected_instances)) {
                    model::Split::Even
                } else {
                    model::Split::ByDemand
                };
                let budget = Budget {
                    set_at: SetAt::Request,
                    // The count it is split from is the last one read.
                    read: shared.budget().map_or(Read::Complete, |b| b.read),
                    ..model::budget(
                        p,
                        &self.view(),
                        shared,
                        (window_start, now),
                        (phantoms, fleet),
                        split,
                    )
                };
                shared.set_budget(budget);
                budget
            }
        };
        let since = self.local.saturating_sub(budget.local_at);
        u64::from(since) + cost <= model::budget_now(p, &self.view(), &budget, window_start, now)
    }
}

/// Why the policy refused a request.
pub(super) enum Refusal {
    /// The estimate of the global count has no room for it (or, reactive, the scaled count).
    Limit,
    /// This instance's budget until its next reply is spent.
    Budget,
    /// Only what this instance assumes of the others and has not read leaves no room (see
    /// `room_for`): reading the store tells, from `from` on.
    Unread { from: Nanos },
}
