//! How much room a request has under the predictive policy: the estimate of the global count,
//! this instance's budget (split by demand, or evenly where rates say nothing), and when reading
//! the store is worth it before refusing on what this instance only assumes of the others.

use sluice_core::Nanos;

use super::super::flags::KeyFlags;
use super::super::model;
use super::super::params::SyncedParams;
use super::super::shared::{Budget, Read, Shared};
use super::{EARLY_SYNC_RETRY_NS, KeyState};
use crate::health::StoreView;

impl KeyState {
    /// When a read of the store is worth it before refusing `cost` more: when only what this
    /// instance assumes of the others leaves no room. That is the instances not listed yet
    /// (taken to count what this one does, while they may not count the key at all: a client
    /// pinned here; a read settles them once the boundary's flushes have landed,
    /// [`SyncedParams::read_ahead_margin`] after it), or, when it has not heard of the key for
    /// a span, the others' demand since (an instance whose demand fell sends nothing to say
    /// so: a client quiet between bursts; not for a spent budget, which a burst on every
    /// instance spends at once: read again, each would take a new budget from a room the
    /// others' bursts already fill). Not for a limit too small to share among the fleet: each
    /// instance's cold share is a large part of it.
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
            .then(|| now.max(p.span_of(now).saturating_mul(p.span_ns) + p.read_ahead_margin()))
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
        &mut self,
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
            && let Err(refusal) =
                self.within_budget(p, shared, (window_start, now), cost, (phantoms, store))
        {
            Some(refusal)
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
    /// if the window has none yet: a new window before this instance's first reply in it);
    /// refused, whether a read set off by the new budget tells more in a moment.
    fn within_budget(
        &mut self,
        p: &SyncedParams,
        shared: &mut Shared,
        (window_start, now): (Nanos, Nanos),
        cost: u64,
        (phantoms, store): (u64, StoreView),
    ) -> Result<(), Refusal> {
        let fleet = store.fleet;
        let mut read_asked = false;
        // A budget lasts until the next reply, due at the next span boundary; a key with
        // nothing to flush there got none, and the budget set for an earlier span would be
        // spent on a later one's demand (a burst after a quiet span): set it again.
        let budget = match shared.budget() {
            Some(budget) if p.span_of(budget.at) == p.span_of(now) => budget,
            previous => {
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
                    // Split from the count last read, as that read was.
                    read: previous.map_or(Read::Complete, |b| b.read),
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
                read_asked = split == model::Split::Even && self.read_first(&budget, store);
                budget
            }
        };
        let since = self.local.saturating_sub(budget.local_at);
        if u64::from(since) + cost <= model::budget_now(p, &self.view(), &budget, window_start, now)
        {
            Ok(())
        } else if read_asked {
            Err(Refusal::Unread {
                from: now.saturating_add(EARLY_SYNC_RETRY_NS),
            })
        } else {
            Err(Refusal::Budget)
        }
    }

    /// Whether a budget just set evenly at a request after a quiet span (nothing to flush at
    /// its boundary, nothing in flight) asks for an early sync. It was split from the count
    /// last read; when that read was a boundary's reply that may have come before the others'
    /// flushes of the boundary (and no early sync followed it), the room it shows holds none
    /// of what they flushed there. The early sync reads the count as it is, and its reply
    /// sets the budget again. Measured (`mix/short.yaml`, a bursty client on five instances,
    /// quiet between bursts): instances that had read 73, 87 and 103 of 120 where the count
    /// was 105 each took a fifth of what they read was left, budgets of 9, 6 and 3 of a room
    /// of 15, a window at 125 of 120 (real processes: 126); with the read, none over in the
    /// simulator, 0-4.2% over on real processes. Only after such a read: asked at every budget
    /// set after a quiet span, the early syncs at a burst's first requests published the
    /// instances' entries with a trickle's rate while each held a fifth of the room, and the
    /// others split what they read by that demand (the surge of `mix/five.yaml`: 15% over).
    fn read_first(&mut self, budget: &Budget, store: StoreView) -> bool {
        let quiet = self.unflushed == 0 && !self.has(KeyFlags::IN_FLIGHT);
        quiet
            && budget.read == Read::BeforeOthers
            && store.health.answering()
            && self.activity.ask_early()
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
