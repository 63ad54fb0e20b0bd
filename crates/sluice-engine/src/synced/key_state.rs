//! One synced key's state machine, pure: [`KeyState::check`] decides a request,
//! [`KeyState::drain`] takes what the next flush sends, [`KeyState::absorb`] applies its reply.
//! Nothing here touches a map, a lock, a clock or the store: the caller passes the time and
//! the key's [`Shared`] state (if it has one), so each transition can be tested on its own.

use std::time::Duration;

use sluice_core::{Allowed, Decision, Denied, InsufficientCapacity, Nanos};
use sluice_store::{FlushOutcome, NodeEntry};

use super::flags::{Activity, KeyFlags};
use super::model;
use super::params::SyncedParams;
use super::shared::Shared;
use super::time::{Deadline, Demand, Stamp};
use crate::health::StoreView;
use crate::verdict::Reason;

mod absorb;
mod drain;
mod record;
mod room;

use room::Refusal;

pub(super) fn sat32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// One key's state, kept small (52 bytes, asserted below): a rule holds one per tracked key.
/// Counts are 32-bit (as Envoy's `requests_per_unit`; the config refuses larger limits) and
/// times are 32-bit offsets from the key's window start.
#[derive(Debug, Default)]
pub(crate) struct KeyState {
    /// The window's number, its low 32 bits (the full number comes from the time of the call).
    window: u32,
    /// Admitted here in `window`.
    pub(super) local: u32,
    /// Admitted here in `window` and not yet sent.
    unflushed: u32,
    /// The others' part of the window total read at the last flush (the total minus this
    /// instance's count at the moment of the read).
    pub(super) others_read: u32,
    /// The previous window's totals (global: the node estimate and the sliding estimate).
    pub(super) prev_global: u32,
    pub(super) prev_local: u32,
    /// Admitted in the current span (`span`).
    span_count: u32,
    /// Hits offered (admitted or not) since the last flush.
    offered: u32,
    /// Counts of the previous window that never reached the store.
    carry: u32,
    /// This instance's demand for the key (a moving average, sampled at each flush).
    pub(super) demand: Demand,
    /// When the demand was last sampled.
    demand_at: Stamp,
    blocked_until: Deadline,
    /// The span of the last check: the low 16 bits of its number.
    span: u16,
    flags: KeyFlags,
    activity: Activity,
}

const _: () = assert!(std::mem::size_of::<KeyState>() == 52);

#[cfg(test)]
impl KeyState {
    /// A key whose window's low 32 bits are `window` (tests of the wrap-around).
    pub(crate) fn in_window(window: u32) -> Self {
        Self {
            window,
            ..Self::default()
        }
    }

    /// The key's window (as of window `w`), its unsent count there and the previous window's
    /// carried count.
    pub(crate) fn pending(&self, w: u64) -> (u64, u32, u32) {
        (self.key_window(w), self.unflushed, self.carry)
    }
}

/// Counts a flush carries for one key, and the window they belong to: what the key needs back
/// to settle the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flight {
    /// The key's window when the flush was taken.
    pub window: u64,
    /// The previous window's count that had not reached the store.
    pub carry: Option<u32>,
    /// The window's count.
    pub current: Option<u32>,
    /// Sent ahead of the span boundary (an early sync), not at it.
    pub early: bool,
    /// When the flush took the counts (this instance's clock).
    pub sent_at: Nanos,
    /// Requests were refused since the flush before: this instance's budget, or its estimate
    /// of the others, had stopped admitting when this flush was taken.
    pub refused: bool,
}

/// What [`KeyState::drain`] hands to the flush.
/// One key's counts on their way to the store.
#[derive(Debug)]
pub(crate) struct Sending {
    pub flight: Flight,
    /// This instance's entry, when the key exchanges entries in this flush.
    pub entry: Option<NodeEntry>,
    /// This instance's first write of the key in the window: the store sets the TTL and
    /// returns the previous window's total.
    pub first_write: bool,
}

#[derive(Debug)]
pub(crate) enum Drain {
    /// Counts (or an entry exchange) to send.
    Send(Sending),
    /// Nothing to send; the key stays.
    Quiet,
    /// Nothing to send, nothing in flight, not checked for three windows, not blocked: the
    /// key can be forgotten.
    Idle,
}

/// The store's answer for a flight's items: `None` where a count did not reach it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Replies<'a> {
    pub carry: Option<&'a FlushOutcome>,
    pub current: Option<&'a FlushOutcome>,
}

impl KeyState {
    fn has(&self, flag: KeyFlags) -> bool {
        self.flags.contains(flag)
    }

    /// Whether the key's sharing is settled (see [`super::flags::Sharing`]).
    pub(crate) fn settled(&self) -> bool {
        self.flags.sharing().settled()
    }

    /// Whether a reply for the key carried entries: its cold start is over.
    fn seen_entries(&self) -> bool {
        self.flags.sharing().seen_entries()
    }

    /// What the model reads of this key.
    pub(crate) fn view(&self) -> model::KeyView {
        model::KeyView {
            local: self.local,
            others_read: self.others_read,
            prev_global: self.prev_global,
            prev_local: self.prev_local,
            demand: self.demand,
            settled: self.settled(),
        }
    }

    /// Whether an early sync was asked for since the last call (see [`Activity::ask_early`]).
    pub(crate) fn take_early_sync(&mut self) -> bool {
        self.activity.take_to_queue()
    }

    /// Whether the key has shared state in its rule's second map.
    pub(crate) fn has_shared(&self) -> bool {
        self.has(KeyFlags::HAS_SHARED)
    }

    pub(crate) fn set_has_shared(&mut self, has: bool) {
        self.flags.set(KeyFlags::HAS_SHARED, has);
    }

    /// The key's window number, from the 32 bits kept and the window `w` of now (a clock that
    /// went back leaves the key's window ahead of now's).
    pub(crate) fn key_window(&self, w: u64) -> u64 {
        let behind = (w as u32).wrapping_sub(self.window) as i32;
        w.wrapping_sub(i64::from(behind) as u64)
    }

    pub(crate) fn blocked_until(&self, p: &SyncedParams, window_start: Nanos) -> Nanos {
        p.timeline().until(window_start, self.blocked_until)
    }

    fn set_blocked_until(&mut self, p: &SyncedParams, window_start: Nanos, until: Nanos) {
        self.blocked_until = p.timeline().deadline(window_start, until);
    }

    /// Counts admitted here and not yet acknowledged by the store (unsent, or carried from the
    /// previous window), not counting a flight in progress.
    pub(crate) fn unsent(&self) -> u64 {
        u64::from(self.unflushed) + u64::from(self.carry)
    }

    pub(crate) fn local(&self) -> u64 {
        self.local.into()
    }

    pub(crate) fn others_read(&self) -> u64 {
        self.others_read.into()
    }

    /// Takes back `amount` a client did not use: from the unsent count exactly; beyond it the
    /// store already holds the count, so only this instance's own view is lowered.
    pub(crate) fn refill(&mut self, amount: u64) {
        let amount = sat32(amount);
        self.unflushed -= amount.min(self.unflushed);
        self.local = self.local.saturating_sub(amount);
        self.span_count = self.span_count.saturating_sub(amount);
    }

    /// Keeps `amount` just admitted out of the next flush (the store may hold it already); it
    /// still counts in this instance's own view of the window.
    pub(crate) fn unsend(&mut self, amount: u64) {
        self.unflushed -= sat32(amount).min(self.unflushed);
    }

    /// The key's state for the rule a reload built in place of the rule `from` (same window;
    /// a new limit, spans, policy or cooldown): what it counted here in window `w` and what it
    /// read of the others, the previous window's totals and a block already earned. Its
    /// unsent counts stay with the old rule, which the flusher keeps flushing until it is
    /// done: none is sent twice. `None` when the key has nothing in window `w`.
    pub(crate) fn carried(
        old: &KeyState,
        (from, to): (&SyncedParams, &SyncedParams),
        w: u64,
        now: Nanos,
    ) -> Option<KeyState> {
        let window_start = to.window_start(w);
        let blocked_until = old.blocked_until(from, from.window_start(old.key_window(w)));
        let current = old.has(KeyFlags::INIT) && old.key_window(w) == w;
        if !current && blocked_until <= now {
            return None;
        }
        let mut key = KeyState::default();
        key.roll(to, None, w, now);
        if current {
            key.local = old.local;
            key.others_read = old.others_read;
            key.prev_global = old.prev_global;
            key.prev_local = old.prev_local;
        }
        if blocked_until > now {
            key.set_blocked_until(to, window_start, blocked_until);
        }
        Some(key)
    }

    /// Moves the key to the window `w` of `now` if it is behind.
    pub(crate) fn roll(
        &mut self,
        p: &SyncedParams,
        shared: Option<&mut Shared>,
        w: u64,
        now: Nanos,
    ) {
        let timeline = p.timeline();
        if !self.has(KeyFlags::INIT) {
            self.flags.insert(KeyFlags::INIT);
            self.window = w as u32;
            // Demand is measured from the key's first sight, not from the epoch.
            self.demand_at = timeline.stamp(p.window_start(w), now);
            return;
        }
        let kw = self.key_window(w);
        if w <= kw {
            return;
        }
        let gap = w - kw;
        // Nothing lost: the unsent count goes to its own window while that key lives (two
        // windows). An older carry no longer matters for any decision.
        self.carry = if gap == 1 { self.unflushed } else { 0 };
        let window_total = u64::from(self.local) + u64::from(self.others_read);
        (self.prev_global, self.prev_local) = if gap == 1 {
            (sat32(window_total), self.local)
        } else {
            (0, 0)
        };
        // Times are kept from the window start: move them to the new one.
        let (old_start, start) = (p.window_start(kw), p.window_start(w));
        let blocked_until = self.blocked_until(p, old_start);
        self.blocked_until = Deadline::default();
        if blocked_until > start {
            self.set_blocked_until(p, start, blocked_until);
        }
        let demand_at = timeline.at(old_start, self.demand_at);
        self.demand_at = timeline.stamp(start, demand_at);
        self.activity.shift(gap);
        self.flags.set_sharing(self.flags.sharing().new_window());
        self.flags.remove(KeyFlags::PREV_KNOWN);
        if gap >= 2 {
            // A whole window has passed: the span kept is not the current one, and after
            // 2^16 spans its low bits could look current.
            self.flags.remove(KeyFlags::SPAN_SET);
        }
        if let Some(shared) = shared {
            shared.roll(start);
        }
        self.window = w as u32;
        self.local = 0;
        self.unflushed = 0;
        self.others_read = 0;
    }

    fn block(&mut self, p: &SyncedParams, window_start: Nanos, now: Nanos) {
        let until = if p.cooldown_ns == 0 {
            window_start + p.window_ns
        } else {
            now + p.cooldown_ns
        };
        self.set_blocked_until(p, window_start, until);
    }

    /// Puts a count that did not reach the store back where the next flush picks it up.
    fn restore(&mut self, key_window: u64, window: u64, count: u32) {
        if window == key_window {
            self.unflushed = self.unflushed.saturating_add(count);
        } else if window + 1 == key_window {
            self.carry = self.carry.saturating_add(count);
        }
        // Older than the previous window: its key has expired in the store and no decision
        // depends on it any more.
    }

    /// Decides a request of `cost` at `now`, and counts it if admitted.
    pub(crate) fn check(
        &mut self,
        p: &SyncedParams,
        mut shared: Option<&mut Shared>,
        now: Nanos,
        cost: u64,
        store: StoreView,
    ) -> (Decision, Option<Reason>) {
        let w = p.window_of(now);
        self.roll(p, shared.as_deref_mut(), w, now);
        let window_start = p.window_start(self.key_window(w));
        let span_end = self.enter_span(p, now);
        self.activity.mark();
        let reset_after = (window_start + p.window_ns).saturating_sub(now);
        if cost > p.limit {
            let capacity = p.limit;
            let decision = Decision::InsufficientCapacity(InsufficientCapacity { cost, capacity });
            return (decision, None);
        }
        let cost32 = sat32(cost);
        self.offered = self.offered.saturating_add(cost32);
        let denied = |retry: Nanos| {
            Decision::Denied(Denied {
                retry_after: Duration::from_nanos(retry.max(1)),
                reset_after: Duration::from_nanos(reset_after),
            })
        };
        let blocked_until = self.blocked_until(p, window_start);
        if now < blocked_until {
            return (denied(blocked_until - now), Some(Reason::GlobalBlock));
        }
        if let Some(reason) = self.over_fallback_share(p, cost, store) {
            let retry = match reason {
                // The next news of the others: an early sync asked for now comes back within
                // moments; otherwise the span's flush.
                FallbackDenial::ColdSpan => self.next_news(now, span_end),
                FallbackDenial::StoreDown => {
                    self.block(p, window_start, now);
                    self.blocked_until(p, window_start).saturating_sub(now)
                }
            };
            return (denied(retry), Some(Reason::Fallback));
        }
        let used = match self.room_for(p, shared, window_start, now, cost, store) {
            Ok(used) => used,
            // A penalty (a cooldown longer than the window), and the limit certainly exceeded
            // by demand (see `exceeded_for_penalty`), an estimate aside. The block starts now
            // and the key is counted up to one over the limit, so every instance learns of it
            // from its next flush reply (this window's total, or the previous one's).
            Err(_) if self.exceeded_for_penalty(p, cost) => {
                let retry = self.start_penalty(p, window_start, now);
                return (denied(retry), Some(Reason::GlobalBlock));
            }
            Err(Refusal::Limit) => return (denied(reset_after), Some(Reason::Estimate)),
            // Room only what this instance assumes of the others may hold: reading the store
            // again tells (and, for instances not listed yet, once a boundary's flushes have
            // all landed, settles the key: see `settles`).
            Err(Refusal::Unread { from }) => {
                let retry = if from > now {
                    from - now
                } else {
                    self.next_news(now, span_end)
                };
                return (denied(retry), Some(Reason::Estimate));
            }
            // The budget is set again at the next reply: the span's flush.
            Err(Refusal::Budget) => return (denied(span_end - now), Some(Reason::Estimate)),
        };
        self.count_admitted(p, cost32, store);
        let allowed = Allowed {
            remaining: p.limit.saturating_sub(used + cost),
            reset_after: Duration::from_nanos(reset_after),
            delay: Duration::ZERO,
        };
        (Decision::Allowed(allowed), None)
    }

    /// Counts an admitted request; asks for an early sync once the cold span's share is spent.
    fn count_admitted(&mut self, p: &SyncedParams, cost32: u32, store: StoreView) {
        self.local = self.local.saturating_add(cost32);
        self.unflushed = self.unflushed.saturating_add(cost32);
        self.span_count = self.span_count.saturating_add(cost32);
        if self.cold_share_spent(p, store) {
            self.activity.ask_early();
        }
    }

    /// Enters `now`'s span if it is a new one (spans only move forward); the span's end.
    fn enter_span(&mut self, p: &SyncedParams, now: Nanos) -> Nanos {
        let span = p.span_of(now);
        if !self.has(KeyFlags::SPAN_SET) || (span as u16).wrapping_sub(self.span) as i16 > 0 {
            self.span = span as u16;
            self.flags.insert(KeyFlags::SPAN_SET);
            self.span_count = 0;
            self.activity.new_span();
        }
        (span + 1).saturating_mul(p.span_ns)
    }

    /// When a refused request may try again for news of the others: soon when an early sync
    /// is asked for now, otherwise at the span's flush.
    fn next_news(&mut self, now: Nanos, span_end: Nanos) -> Nanos {
        if self.activity.ask_early() {
            (span_end - now).min(EARLY_SYNC_RETRY_NS)
        } else {
            span_end - now
        }
    }

    /// Starts a penalty's block at `now` and counts the key up to one over the limit, so that
    /// every instance learns of it from its next flush reply; the time until the block ends.
    fn start_penalty(&mut self, p: &SyncedParams, window_start: Nanos, now: Nanos) -> Nanos {
        self.block(p, window_start, now);
        let over = u64::from(self.local) + u64::from(self.others_read);
        let marker = sat32((p.limit + 1).saturating_sub(over).max(1));
        self.local = self.local.saturating_add(marker);
        self.unflushed = self.unflushed.saturating_add(marker);
        self.activity.ask_early();
        self.blocked_until(p, window_start).saturating_sub(now)
    }

    /// Whether a penalty rule's limit is certainly exceeded by a refused request of `cost`:
    /// admitted here, the others' last read count and the demand refused here since the last
    /// flush (hits offered less those admitted; `cost` is among them) are more than the limit.
    fn exceeded_for_penalty(&self, p: &SyncedParams, cost: u64) -> bool {
        let refused = u64::from(self.offered.saturating_sub(self.unflushed)).max(cost);
        p.cooldown_ns > p.window_ns
            && u64::from(self.local) + u64::from(self.others_read) + refused > p.limit
    }

    /// Whether the key, before its first reply, has used up this span's cold share
    /// (MAX/(instances x spans)): it should sync now rather than wait for the span's end.
    /// (A spent budget does not ask: in the simulator that multiplied store calls by up to 15
    /// where keys are shared unevenly, for under 1% more admitted.)
    fn cold_share_spent(&self, p: &SyncedParams, store: StoreView) -> bool {
        let parties = store.fleet.max(p.expected_instances);
        p.predictive()
            && store.health.answering()
            && !self.seen_entries()
            && parties > 1
            && !model::fits_share(p, parties, self.span_count.into(), self.local.into(), 1)
    }

    /// Whether the key must keep to a fallback share it is over: the seed's fallback (and
    /// predictive's, for a key whose entries it never saw) while the store is unreachable, at
    /// most MAX/N per span per instance (N: the node estimate, and for predictive at least the
    /// instances the store last counted); or, predictive, before
    /// the first reply for the key (an instance that just joined, or a key it never saw): it
    /// knows nothing of the others yet, so until the reply comes (at most a span) it keeps to
    /// MAX/N per span with N the instances it expects. No block then: the reply lifts it.
    fn over_fallback_share(
        &self,
        p: &SyncedParams,
        cost: u64,
        store: StoreView,
    ) -> Option<FallbackDenial> {
        let seen_entries = self.seen_entries();
        let (span_count, local) = (u64::from(self.span_count), u64::from(self.local));
        let cold = p.predictive() && !seen_entries && store.health.answering();
        let parties = store.fleet.max(p.expected_instances);
        if cold && parties > 1 && !model::fits_share(p, parties, span_count, local, cost) {
            return Some(FallbackDenial::ColdSpan);
        }
        // Predictive: at least the instances the store counted before it went silent.
        let floor = if p.predictive() { parties } else { 1 };
        let nodes = model::node_estimate(&self.view()).max(floor);
        let use_fallback = !store.health.answering() && (!p.predictive() || !seen_entries);
        (use_fallback && !model::fits_share(p, nodes, span_count, local, cost))
            .then_some(FallbackDenial::StoreDown)
    }

    /// Whether the key is blocked at `now` (`window`: its window then).
    pub(crate) fn blocked_at(&self, p: &SyncedParams, window: u64, now: Nanos) -> bool {
        self.blocked_until(p, p.window_start(window)) > now
    }
}

/// How long a request denied while an early sync is on its way is told to wait: the sync is
/// coalesced for a few milliseconds and takes one round trip to the store.
const EARLY_SYNC_RETRY_NS: u64 = 25_000_000;

/// Why a fallback share denied a request.
enum FallbackDenial {
    /// Predictive, before the key's first reply: denied until the span ends.
    ColdSpan,
    /// The store is unreachable: blocked like a key over its limit.
    StoreDown,
}
