//! `synced` mode (docs/SYNCED.md): counts in memory, one flush per span, and the `reactive`
//! (seed) and `predictive` policies.
//!
//! [`KeyState`] is one key's pure state machine; [`model`] its arithmetic; [`SyncedRule`]
//! keeps a rule's keys in lock-free maps, each key behind its own lock.
//!
//! Memory per tracked key (docs/BENCHMARKS.md): one map entry holding the key's name (inline
//! up to 15 bytes) and its 52-byte [`KeyState`] behind a one-byte lock. What only keys
//! counted by several instances need (the others' entries, the demand budget, the grace after
//! an outage) lives in a second map of [`Shared`] values, entered only for those keys and only
//! under the key's own lock.

mod flags;
mod key_state;
mod model;
mod params;
mod part;
mod recent;
mod reply;
mod shared;
mod small;
mod time;

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_boundary;
#[cfg(test)]
mod tests_cold_start;

use std::sync::Arc;

use ecow::EcoString;
use papaya::HashMap;
use parking_lot::Mutex;
use sluice_core::{Decision, Nanos};
use sluice_store::FlushItem;

pub(crate) use key_state::{Drain, Flight, KeyState, Replies, Sending};
pub(crate) use params::SyncedParams;
pub use part::FLOOR as FLEET_PART_FLOOR;
use shared::Shared;
pub use small::SMALL_LIMIT_SHARES;

use crate::health::StoreView;
use crate::verdict::Reason;

type FastHasher = foldhash::fast::RandomState;

// With the lock and the inline name, a map entry is 72 bytes: one 80-byte allocation.
const _: () = assert!(std::mem::size_of::<(EcoString, Mutex<KeyState>)>() == 72);

/// What one flush sweep over a rule's keys found (idle keys it removed, and the gauges).
#[derive(Debug, Default)]
pub(crate) struct Sweep {
    pub evicted: usize,
    /// Instances counting the busiest key (this one included).
    pub live_instances: usize,
    /// Keys blocked now.
    pub blocked: usize,
    /// The seed's node estimate, largest over the keys.
    pub node_estimate: u64,
}

/// One key's counts in the flush in progress: where its items are, so that the reply (or a
/// failure) goes back to the key.
pub(crate) struct PendingFlush {
    /// The key's name in the rule's map.
    pub name: EcoString,
    pub flight: Flight,
    /// Indexes of the flight's items (carry, current) in the flush.
    pub carry_item: usize,
    pub current_item: usize,
}

/// A flight's items: the previous window's carried count, then the window's count. Returns
/// their indexes in `items`.
fn push_items(
    p: &SyncedParams,
    store_key: Arc<str>,
    flight: &Flight,
    entry: Option<sluice_store::NodeEntry>,
    first_write: bool,
    items: &mut Vec<FlushItem>,
) -> (usize, usize) {
    let carry_item = items.len();
    if let Some(count) = flight.carry {
        items.push(FlushItem {
            key: store_key.clone(),
            window: flight.window - 1,
            delta: count.into(),
            ttl: p.ttl(),
            entry: None,
            want_previous: false,
            // The window's key may not exist yet (the store was down all along).
            first_write: true,
        });
    }
    let current_item = items.len();
    if let Some(count) = flight.current {
        items.push(FlushItem {
            key: store_key,
            window: flight.window,
            delta: count.into(),
            ttl: p.ttl(),
            entry,
            want_previous: first_write && p.reads_previous(),
            first_write,
        });
    }
    (carry_item, current_item)
}

/// Where an admitted request's count goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counting {
    /// Here, and to the store with the next flush.
    Here,
    /// Here only: the store may hold it already (its decision timed out).
    MaybeAtStore,
}

/// One synced rule: its keys and parameters.
pub(crate) struct SyncedRule {
    pub params: SyncedParams,
    pub rule_id: Arc<str>,
    /// The tracked keys. The store key is rebuilt from the rule id and the name at flush time
    /// instead of being kept per key.
    pub keys: HashMap<EcoString, Mutex<KeyState>, FastHasher>,
    /// The [`Shared`] state of the keys that have one; entered only under the key's lock.
    shared: HashMap<EcoString, Mutex<Shared>, FastHasher>,
    /// Keys that asked for an early sync (each at most once a span), for the next early
    /// flush; at most [`EARLY_QUEUE_MAX`] (beyond that a key waits for its span's flush).
    early: Mutex<Vec<EcoString>>,
    /// A flush reply queued a key for an early sync (the flusher wakes its loop).
    early_from_reply: std::sync::atomic::AtomicBool,
    /// Decisions at the store while the limit is too small to share (see [`small`]).
    small: Option<Box<small::SmallLimit>>,
}

/// The most keys of one rule waiting for an early sync: a key spray that has every key ask
/// costs at most this many names (the span's flush takes the rest).
const EARLY_QUEUE_MAX: usize = 16_384;

/// How long after a span boundary a key that read ahead of the others' flushes reads again, and
/// a read settles whether a key is shared (at most a twentieth of a span; `read_ahead_at`).
pub const READ_AHEAD_MARGIN: std::time::Duration = std::time::Duration::from_millis(25);

fn map<V>(capacity: usize) -> HashMap<EcoString, V, FastHasher> {
    HashMap::builder()
        .hasher(FastHasher::default())
        .capacity(capacity)
        // Free a replaced table at once: with seize's default batch of 32 the (request) thread
        // that resized keeps the old table until it retires 31 more objects, i.e. for good.
        .collector(seize::Collector::new().batch_size(1))
        .resize_mode(papaya::ResizeMode::Blocking)
        .build()
}

impl SyncedRule {
    pub(crate) fn new(
        params: SyncedParams,
        rule_id: Arc<str>,
        (small_limits, small_limit_calls): (sluice_config::SmallLimits, u32),
    ) -> Self {
        Self {
            small: small::store_decisions(&params, small_limits, small_limit_calls).map(Box::new),
            params,
            rule_id,
            keys: map(1024),
            shared: map(64),
            early: Mutex::new(Vec::new()),
            early_from_reply: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// After a reload that changed this rule's limit (not its window): takes over what each
    /// key of `old` counted and read in the current window (see [`KeyState::carried`]), so
    /// that no key starts over before its next flush reply. Returns how many keys carried.
    pub(crate) fn carry_from(&self, old: &SyncedRule, now: Nanos) -> usize {
        let w = self.params.window_of(now);
        let (theirs, ours) = (old.keys.pin(), self.keys.pin());
        let mut carried = 0;
        for (name, cell) in theirs.iter() {
            let state = cell.lock();
            if let Some(key) = KeyState::carried(&state, (&old.params, &self.params), w, now) {
                ours.insert(name.clone(), Mutex::new(key));
                carried += 1;
            }
        }
        carried
    }

    /// Whether the store found `key` over its limit until after `now`.
    pub(crate) fn store_blocked(&self, key: &str, now: Nanos) -> bool {
        self.small
            .as_ref()
            .is_some_and(|s| s.decisions.is_blocked(key, now))
    }

    /// Checks a request against the key `key` (an encoded descriptor). The third value says
    /// whether the key just asked for an early sync (it is queued: wake the flusher).
    pub(crate) fn check(
        &self,
        key: &str,
        now: Nanos,
        cost: u64,
        store: StoreView,
    ) -> (Decision, Option<Reason>, bool) {
        self.check_counting(key, now, cost, store, Counting::Here)
    }

    /// [`SyncedRule::check`] for a request whose store decision timed out: the store may have
    /// counted it, so an admission counts here (this instance's share) but is not flushed.
    /// At worst a call that never reached the store leaves one admission uncounted; flushing
    /// it could count one twice.
    pub(crate) fn check_after_timeout(
        &self,
        key: &str,
        now: Nanos,
        cost: u64,
        store: StoreView,
    ) -> (Decision, Option<Reason>, bool) {
        self.check_counting(key, now, cost, store, Counting::MaybeAtStore)
    }

    fn check_counting(
        &self,
        key: &str,
        now: Nanos,
        cost: u64,
        store: StoreView,
        counting: Counting,
    ) -> (Decision, Option<Reason>, bool) {
        let guard = self.keys.guard();
        let entry = match self.keys.get(key, &guard) {
            Some(k) => k,
            None => self
                .keys
                .get_or_insert_with(EcoString::from(key), Mutex::default, &guard),
        };
        let mut state = entry.lock();
        let (decision, reason) = if state.has_shared() {
            let shared_guard = self.shared.guard();
            let mut shared = self.lock_shared(&state, key, &shared_guard);
            state.check(&self.params, shared.as_deref_mut(), now, cost, store)
        } else {
            state.check(&self.params, None, now, cost, store)
        };
        if counting == Counting::MaybeAtStore && decision.is_allowed() {
            state.unsend(cost);
        }
        let early = state.take_early_sync() && self.queue_early(key);
        (decision, reason, early)
    }

    /// Queues `key` for the next early flush; false when the queue is full.
    fn queue_early(&self, key: &str) -> bool {
        let mut queue = self.early.lock();
        if queue.len() >= EARLY_QUEUE_MAX {
            return false;
        }
        queue.push(EcoString::from(key));
        true
    }

    /// When a key whose flush reply came before the others' flushes of the same span boundary
    /// reads again (its early sync): [`READ_AHEAD_MARGIN`] after the boundary (at most a
    /// twentieth of a span), on this instance's clock. Instances flush at the boundary by
    /// their own clocks, which differ by what clock sync leaves (the store's clock read over
    /// a round trip, or NTP with etcd); a read sent at once would miss an instance whose
    /// flush lands a few milliseconds later and take its count from its demand a whole span
    /// longer (measured: `examples/scenarios/stress/clock-spread.yaml`, three instances with
    /// clocks 10 ms apart, up to 13% over the limit).
    pub(crate) fn read_ahead_at(&self, now: Nanos) -> Nanos {
        let p = &self.params;
        p.span_of(now).saturating_mul(p.span_ns) + p.read_ahead_margin()
    }

    /// Whether a flush reply queued a key for an early sync since the last call.
    pub(crate) fn take_early_from_reply(&self) -> bool {
        self.early_from_reply
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the counts of the keys that asked for an early sync into `items` (one
    /// [`PendingFlush`] each in `pending`).
    pub(crate) fn prepare_early(
        &self,
        now: Nanos,
        node: &Arc<str>,
        items: &mut Vec<FlushItem>,
        pending: &mut Vec<PendingFlush>,
    ) {
        let mut names = std::mem::take(&mut *self.early.lock());
        // A key can ask twice between two early flushes (a request, then a reply).
        names.sort_unstable();
        names.dedup();
        let p = &self.params;
        let guard = self.keys.guard();
        let shared_guard = self.shared.guard();
        let mut key_buf = String::with_capacity(128);
        for name in names {
            let Some(key) = self.keys.get(&name, &guard) else {
                continue;
            };
            let mut state = key.lock();
            let mut shared = self.lock_shared(&state, &name, &shared_guard);
            if let Drain::Send(sent) = state.drain(p, shared.as_deref_mut(), node, now, true) {
                self.send(name, sent, &mut key_buf, items, pending);
            }
        }
    }

    /// Puts one key's drained counts into the flush: its items, and what to apply the reply to.
    fn send(
        &self,
        name: EcoString,
        sent: Sending,
        key_buf: &mut String,
        items: &mut Vec<FlushItem>,
        pending: &mut Vec<PendingFlush>,
    ) {
        key_buf.clear();
        sluice_store::CounterKey::write_encoded(key_buf, &self.rule_id, &name);
        let (carry_item, current_item) = push_items(
            &self.params,
            key_buf.as_str().into(),
            &sent.flight,
            sent.entry,
            sent.first_write,
            items,
        );
        pending.push(PendingFlush {
            name,
            flight: sent.flight,
            carry_item,
            current_item,
        });
    }

    /// Gives back `amount` for `key`. Counts not yet flushed are taken back exactly; beyond
    /// them the store already holds the count, so only this instance's own view is lowered
    /// (the global total stays conservative). Returns whether the key was tracked.
    pub(crate) fn refill(&self, key: &str, amount: u64) -> bool {
        let guard = self.keys.guard();
        let Some(k) = self.keys.get(key, &guard) else {
            return false;
        };
        k.lock().refill(amount);
        true
    }

    /// Takes every key's counts to send into `items` (one [`PendingFlush`] per key in
    /// `pending`) and removes idle keys, in one pass that also takes the rule's gauges.
    pub(crate) fn prepare_flush(
        &self,
        now: Nanos,
        node: &Arc<str>,
        items: &mut Vec<FlushItem>,
        pending: &mut Vec<PendingFlush>,
    ) -> Sweep {
        let p = &self.params;
        let guard = self.keys.guard();
        let shared_guard = self.shared.guard();
        let mut idle: Vec<EcoString> = Vec::new();
        let mut key_buf = String::with_capacity(128);
        let mut sweep = Sweep {
            live_instances: 1,
            node_estimate: 1,
            ..Sweep::default()
        };
        for (name, key) in self.keys.iter(&guard) {
            let mut state = key.lock();
            let mut shared = self.lock_shared(&state, name, &shared_guard);
            let drain = state.drain(p, shared.as_deref_mut(), node, now, false);
            let window = state.key_window(p.window_of(now));
            let others = shared
                .as_deref()
                .map_or(0, |x| x.live_others(p, now).count());
            sweep.live_instances = sweep.live_instances.max(others + 1);
            sweep.blocked += usize::from(state.blocked_at(p, window, now));
            sweep.node_estimate = sweep.node_estimate.max(model::node_estimate(&state.view()));
            match drain {
                Drain::Send(sent) => self.send(name.clone(), sent, &mut key_buf, items, pending),
                Drain::Quiet => {}
                Drain::Idle => idle.push(name.clone()),
            }
        }
        for name in &idle {
            self.keys.remove(name, &guard);
            self.shared.remove(name, &shared_guard);
        }
        sweep.evicted = idle.len();
        // Keys the store refused (a limit too small to share) are blocked too; those whose
        // block has passed are forgotten.
        if let Some(small) = &self.small {
            sweep.evicted += small.decisions.evict(now);
            sweep.blocked += small.decisions.blocked();
        }
        sweep
    }

    /// Applies a flush's answer to one key: `outcome(i)` is item `i`'s outcome, `None` where
    /// the count did not reach the store. Returns whether all of the key's counts arrived.
    pub(crate) fn apply<'a>(
        &self,
        pending: &PendingFlush,
        outcome: impl Fn(usize) -> Option<&'a sluice_store::FlushOutcome>,
        node: &str,
        (now, store): (Nanos, StoreView),
    ) -> bool {
        let guard = self.keys.guard();
        let Some(key) = self.keys.get(&pending.name, &guard) else {
            // Only idle keys are removed, and a key with counts in flight is not idle.
            return false;
        };
        let flight = &pending.flight;
        let replies = Replies {
            carry: flight.carry.and_then(|_| outcome(pending.carry_item)),
            current: flight.current.and_then(|_| outcome(pending.current_item)),
        };
        let mut state = key.lock();
        if flight.current.is_none() {
            // A flight with only a carry never touches the shared state.
            return state.absorb(&self.params, &mut None, flight, replies, node, (now, store));
        }
        // The shared state, taken out while the reply is applied (it is only ever touched
        // under the key's lock, which is held) and put back or dropped at the end.
        let shared_guard = self.shared.guard();
        let slot = if state.has_shared() {
            self.shared.get(&pending.name, &shared_guard)
        } else {
            None
        };
        let mut shared: Option<Shared> = slot.map(|x| std::mem::take(&mut *x.lock()));
        let ok = state.absorb(
            &self.params,
            &mut shared,
            flight,
            replies,
            node,
            (now, store),
        );
        if state.take_early_sync() && self.queue_early(&pending.name) {
            self.early_from_reply
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // Keep the shared state while the key has others or a grace, or its sharing is not
        // settled (the instances not listed yet have their share in its budget); drop it after.
        match (shared, slot) {
            (Some(x), slot) if x.needed(now) || !state.settled() => {
                match slot {
                    Some(slot) => *slot.lock() = x,
                    None => {
                        self.shared
                            .insert(pending.name.clone(), Mutex::new(x), &shared_guard);
                    }
                }
                state.set_has_shared(true);
            }
            (_, Some(_)) => {
                self.shared.remove(&pending.name, &shared_guard);
                state.set_has_shared(false);
            }
            _ => {}
        }
        ok
    }

    /// The key's shared state, locked, if it has one (the caller holds the key's lock).
    fn lock_shared<'g>(
        &self,
        state: &KeyState,
        name: &str,
        guard: &'g impl papaya::Guard,
    ) -> Option<parking_lot::MutexGuard<'g, Shared>> {
        state
            .has_shared()
            .then(|| self.shared.get(name, guard).map(|x| x.lock()))
            .flatten()
    }

    pub(crate) fn key_info(
        &self,
        key: &str,
        now: Nanos,
        store: StoreView,
    ) -> Option<crate::KeyInfo> {
        let p = &self.params;
        let guard = self.keys.guard();
        let mut state = self.keys.get(key, &guard)?.lock();
        let shared_guard = self.shared.guard();
        let mut shared = self.lock_shared(&state, key, &shared_guard);
        let w = p.window_of(now);
        state.roll(p, shared.as_deref_mut(), w, now);
        let window = state.key_window(w);
        let window_start = p.window_start(window);
        let shared = shared.as_deref();
        Some(crate::KeyInfo {
            rule_id: Arc::from(""),
            window,
            local: state.local(),
            others_read: state.others_read(),
            live_instances: shared.map_or(0, |x| x.live_others(p, now).count()) + 1,
            node_estimate: model::node_estimate(&state.view()),
            estimate: model::estimate(
                p,
                &state.view(),
                shared,
                window_start,
                now,
                (
                    store.health,
                    model::phantoms(p, &state.view(), shared, now, store.fleet),
                ),
            ),
            blocked_until: state.blocked_until(p, window_start),
            unflushed: state.unsent(),
        })
    }

    /// Whether some key has counts that have not reached the store.
    pub(crate) fn has_unsent(&self) -> bool {
        let guard = self.keys.guard();
        self.keys
            .iter(&guard)
            .any(|(_, key)| key.lock().unsent() > 0)
    }

    /// Keys with shared state (tests).
    #[cfg(test)]
    pub(crate) fn shared_len(&self) -> usize {
        self.shared.len()
    }
}
