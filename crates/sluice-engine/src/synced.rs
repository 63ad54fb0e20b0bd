//! `synced` mode (DESIGN.md section 1): counts in memory, one flush per span, and the
//! `reactive` (seed) and `predictive` policies.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use papaya::HashMap;
use sluice_config::Policy;
use sluice_core::{Decision, Nanos};
use sluice_store::{FlushItem, FlushOutcome, NodeEntry};

use crate::verdict::Reason;

type FastHasher = foldhash::fast::RandomState;

/// A rule's synced settings.
#[derive(Clone, Debug)]
pub(crate) struct SyncedParams {
    pub limit: u64,
    pub window_ns: u64,
    pub spans: u64,
    pub span_ns: u64,
    /// Zero: blocked until the window ends.
    pub cooldown_ns: u64,
    pub policy: Policy,
    /// Add the previous window's weighted total (sliding window counter estimate).
    pub sliding: bool,
    /// Predictive: cap each instance at its demand share of the room left between flushes.
    pub budgets: bool,
    /// Instances the deployment expects (`EngineOptions::expected_instances`).
    pub expected_instances: u64,
}

impl SyncedParams {
    fn ttl(&self) -> Duration {
        Duration::from_nanos(self.window_ns.saturating_mul(2))
    }
}

/// The name given to counts no entry accounts for (never compared with real node ids).
static UNLISTED: std::sync::LazyLock<Arc<str>> =
    std::sync::LazyLock::new(|| Arc::from("(unlisted)"));

/// Another instance's entry for a key.
#[derive(Clone, Debug)]
struct Other {
    node: Arc<str>,
    count: u64,
    /// When it flushed (store-corrected).
    at: Nanos,
    /// Demand, hits per nanosecond.
    rate: f64,
    /// Counts in the window total that no entry accounts for: instances that do not publish
    /// entries (one alone on the key since the window began, a `reactive` one). Their rate is
    /// the count's average over the window so far.
    unlisted: bool,
}

/// A count that belongs to a window: `Option<WindowCount>` takes 16 bytes where
/// `Option<(u64, u64)>` takes 24 (the window is kept plus one, so zero is the niche).
#[derive(Clone, Copy, Debug)]
struct WindowCount {
    window_plus_one: std::num::NonZeroU64,
    count: u64,
}

impl WindowCount {
    fn new(window: u64, count: u64) -> Self {
        Self {
            window_plus_one: std::num::NonZeroU64::MIN.saturating_add(window),
            count,
        }
    }

    fn window(self) -> u64 {
        self.window_plus_one.get() - 1
    }

    fn pair(self) -> (u64, u64) {
        (self.window(), self.count)
    }
}

/// The other instances a key knows of: boxed, so a key counted by this instance alone (most
/// keys under a key-spraying attack) pays one pointer for them instead of an empty `Vec`.
#[derive(Debug, Default)]
#[expect(
    clippy::box_collection,
    reason = "one pointer (8 bytes) per key instead of an empty Vec (24) for unshared keys"
)]
struct Others(Option<Box<Vec<Other>>>);

impl Others {
    fn as_slice(&self) -> &[Other] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    fn as_mut_slice(&mut self) -> &mut [Other] {
        self.0.as_deref_mut().map_or(&mut [], Vec::as_mut_slice)
    }

    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    fn take(&mut self) -> Vec<Other> {
        self.0.take().map(|b| *b).unwrap_or_default()
    }

    fn set(&mut self, others: Vec<Other>) {
        self.0 = (!others.is_empty()).then(|| Box::new(others));
    }
}

/// One key's state. Guarded by its own mutex: different keys never contend.
#[derive(Debug, Default)]
pub(crate) struct KeyState {
    initialized: bool,
    window: u64,
    /// End of the current span: the hot path compares instead of dividing.
    span_end: Nanos,
    /// Admitted here in `window`.
    local: u64,
    /// Admitted here in `window` and not yet sent.
    unflushed: u64,
    /// Sent in the flush in progress: (window, count).
    in_flight: Option<WindowCount>,
    /// Counts of the previous window that never reached the store.
    carry: Option<WindowCount>,
    carry_in_flight: Option<WindowCount>,
    /// Window total read at the last flush, and `local` at that moment.
    global: u64,
    local_at_global: u64,
    /// The previous window's totals (node estimate, sliding estimate).
    prev_global: u64,
    prev_local: u64,
    span_count: u64,
    blocked_until: Nanos,
    /// Hits offered (admitted or not) since the last flush, and the demand EWMA in hits/ns.
    offered: u64,
    rate: f64,
    rate_at: Nanos,
    others: Others,
    seen_entries: bool,
    /// Whether the previous window's total has been read in this window.
    prev_known: bool,
    /// Predictive: what this instance may admit until its next flush reply (its demand share
    /// of the room left in the window), and `local` when that share was set. Zero budget with
    /// `budget_set == false` means no share has been set yet.
    budget: u64,
    local_at_budget: u64,
    budget_set: bool,
    /// Sliding window: when the budget was set and the share it was set with (the room the
    /// previous window's decaying weight frees afterwards is shared the same way).
    budget_at: Nanos,
    budget_share: f32,
    /// A flush of this key failed (the store was unreachable) and none has succeeded since.
    cut_off: bool,
    /// After such a gap, the others' entries count as live until this time: they could not
    /// refresh them either, and their counts from the gap are still on their way.
    grace_until: Nanos,
    /// When the store last answered a flush of this key.
    heard_at: Nanos,
    last_hit: Nanos,
}

impl KeyState {
    fn roll(&mut self, p: &SyncedParams, now: Nanos) {
        if self.initialized && now < (self.window + 1).saturating_mul(p.window_ns) {
            return;
        }
        let w = now / p.window_ns;
        if !self.initialized {
            self.initialized = true;
            self.window = w;
            // Demand is measured from the key's first sight, not from the epoch.
            self.rate_at = now;
            return;
        }
        if w <= self.window {
            return;
        }
        let gap = w - self.window;
        if self.unflushed > 0 {
            // Nothing lost: the unsent count goes to its own window while that key lives
            // (two windows). Older carries no longer matter for any decision.
            let carried = match self.carry.map(WindowCount::pair) {
                Some((cw, cc)) if cw == self.window => cc + self.unflushed,
                _ => self.unflushed,
            };
            self.carry = (gap <= 1).then(|| WindowCount::new(self.window, carried));
        } else if self.carry.is_some_and(|c| w.saturating_sub(c.window()) > 1) {
            self.carry = None;
        }
        let window_total = self.global + (self.local - self.local_at_global.min(self.local));
        (self.prev_global, self.prev_local) = if gap == 1 {
            (window_total.max(self.local), self.local)
        } else {
            (0, 0)
        };
        let window_start = w * p.window_ns;
        for other in self.others.as_mut_slice() {
            // Carry each instance's demand rate into the new window (DESIGN.md: "at the start
            // of a window ... the others' demand rates from the previous window are used").
            other.count = 0;
            other.at = window_start;
        }
        self.window = w;
        self.prev_known = false;
        self.budget_set = false;
        self.local = 0;
        self.unflushed = 0;
        self.global = 0;
        self.local_at_global = 0;
    }

    /// The seed's node estimate: previous window's global / local, at least 1.
    fn node_estimate(&self) -> u64 {
        if self.prev_local == 0 {
            return 1;
        }
        (self.prev_global / self.prev_local).max(1)
    }

    /// Predictive estimate of the global count in the window at `now`.
    fn estimate(&self, p: &SyncedParams, now: Nanos, store_ok: bool) -> f64 {
        let window_start = self.window * p.window_ns;
        let mut others = 0.0;
        for o in self.others.as_slice() {
            others += o.count as f64;
            // An entry not refreshed for two spans belongs to an instance that left; while the
            // store is silent nobody refreshes, so entries do not go stale then.
            let live = !store_ok || now <= self.grace_until || self.fresh(p, o, now);
            if live {
                others += o.rate * now.saturating_sub(o.at.max(window_start)) as f64;
            }
        }
        let own_since_read = self.local - self.local_at_global.min(self.local);
        let mut estimate = (self.local as f64 + others).max((self.global + own_since_read) as f64);
        if p.sliding {
            let elapsed = now.saturating_sub(window_start).min(p.window_ns);
            estimate += self.prev_global as f64 * (1.0 - elapsed as f64 / p.window_ns as f64);
        }
        estimate
    }

    /// Whether another instance's entry is live: one that has not flushed for two spans has
    /// left. Judged now while this instance hears from the store about the key every span;
    /// otherwise as of when it last heard. Between replies an
    /// instance cannot know better, so it keeps extrapolating the others it knows of (an
    /// instance with little traffic for a key asks rarely; forgetting the others in the
    /// meantime would let it spend the whole limit on its own).
    fn fresh(&self, p: &SyncedParams, o: &Other, now: Nanos) -> bool {
        let judged_at = if now.saturating_sub(self.heard_at) < p.span_ns {
            now
        } else {
            self.heard_at
        };
        judged_at.saturating_sub(o.at) <= 2 * p.span_ns
    }

    /// This instance's share of the key's demand (its rate over all live instances' rates).
    fn share(&self, p: &SyncedParams, now: Nanos) -> f64 {
        let (mut total, mut live) = (self.rate, 1.0);
        for o in self.others.as_slice() {
            if now <= self.grace_until || self.fresh(p, o, now) {
                total += o.rate;
                live += 1.0;
            }
        }
        if total > 0.0 {
            (self.rate / total).clamp(0.0, 1.0)
        } else {
            1.0 / live
        }
    }

    /// Sets this instance's budget until its next flush reply: its share of the room the
    /// estimate leaves in the window.
    fn set_budget(&mut self, p: &SyncedParams, now: Nanos) {
        let room = (p.limit as f64 - self.estimate(p, now, true)).max(0.0);
        let share = self.share(p, now);
        self.budget = (room * share).floor() as u64;
        self.local_at_budget = self.local;
        self.budget_set = true;
        self.budget_at = now;
        self.budget_share = share as f32;
    }

    /// The budget now: with a sliding window it grows as the previous window's weight decays.
    fn budget_now(&self, p: &SyncedParams, now: Nanos) -> u64 {
        if !p.sliding {
            return self.budget;
        }
        let window_start = self.window * p.window_ns;
        // The decay since the budget was set, within this window.
        let from = self.budget_at.max(window_start);
        let freed = self.prev_global as f64 * now.saturating_sub(from) as f64 / p.window_ns as f64;
        self.budget + (freed * f64::from(self.budget_share)).floor() as u64
    }

    fn live_others(&self, p: &SyncedParams, now: Nanos) -> usize {
        self.others
            .as_slice()
            .iter()
            .filter(|o| now <= self.grace_until || self.fresh(p, o, now))
            .count()
    }

    fn block(&mut self, p: &SyncedParams, now: Nanos) {
        let window_end = (self.window + 1) * p.window_ns;
        self.blocked_until = if p.cooldown_ns == 0 {
            window_end
        } else {
            now + p.cooldown_ns
        };
    }

    fn check(
        &mut self,
        p: &SyncedParams,
        now: Nanos,
        cost: u64,
        store_ok: bool,
    ) -> (Decision, Option<Reason>) {
        self.roll(p, now);
        if now >= self.span_end {
            let span = now / p.span_ns;
            self.span_end = (span + 1).saturating_mul(p.span_ns);
            // The span end only moves forward: this is a new span.
            self.span_count = 0;
        }
        self.last_hit = now;
        let window_end = (self.window + 1) * p.window_ns;
        let reset_after = window_end.saturating_sub(now);
        if cost > p.limit {
            return (
                Decision::InsufficientCapacity(sluice_core::InsufficientCapacity {
                    cost,
                    capacity: p.limit,
                }),
                None,
            );
        }
        self.offered += cost;
        let denied = |retry: Nanos| {
            Decision::Denied(sluice_core::Denied {
                retry_after: Duration::from_nanos(retry.max(1)),
                reset_after: Duration::from_nanos(reset_after),
            })
        };
        if now < self.blocked_until {
            return (denied(self.blocked_until - now), Some(Reason::GlobalBlock));
        }
        let nodes = self.node_estimate();
        // The seed's fallback (and predictive's, for a key whose entries it never saw): while the
        // store is unreachable, at most MAX/N per span per instance (scaled by the node estimate).
        // Predictive, before the first reply for the key (an instance that just joined, or a
        // key it never saw): it knows nothing of the others yet, so until the reply comes (at
        // most a span) it keeps to the seed's fallback share, MAX/N per span with N the
        // instances it expects. No block: the reply lifts it.
        let cold = p.policy != Policy::Reactive && p.budgets && !self.seen_entries && store_ok;
        if cold
            && p.expected_instances > 1
            && (self.span_count + cost)
                .saturating_mul(p.expected_instances)
                .saturating_mul(p.spans)
                > p.limit
        {
            return (denied(self.span_end - now), Some(Reason::Fallback));
        }
        let use_fallback = !store_ok && (p.policy == Policy::Reactive || !self.seen_entries);
        if use_fallback
            && (self.span_count + cost)
                .saturating_mul(nodes)
                .saturating_mul(p.spans)
                > p.limit
        {
            self.block(p, now);
            return (denied(self.blocked_until - now), Some(Reason::Fallback));
        }
        let used = match p.policy {
            Policy::Reactive => {
                if (self.local + cost).saturating_mul(nodes) > p.limit {
                    return (denied(reset_after), Some(Reason::LocalBudget));
                }
                (self.global + self.local - self.local_at_global.min(self.local))
                    .max(self.local * nodes)
            }
            _ => {
                let estimate = self.estimate(p, now, store_ok);
                if estimate + cost as f64 > p.limit as f64 {
                    return (denied(reset_after), Some(Reason::Estimate));
                }
                if p.budgets && self.seen_entries {
                    if !self.budget_set {
                        // A new window before this instance's first reply in it.
                        self.set_budget(p, now);
                    }
                    if self.local - self.local_at_budget.min(self.local) + cost
                        > self.budget_now(p, now)
                    {
                        return (denied(reset_after), Some(Reason::Estimate));
                    }
                }
                estimate.ceil() as u64
            }
        };
        self.local += cost;
        self.unflushed += cost;
        self.span_count += cost;
        let remaining = p.limit.saturating_sub(used + cost);
        (
            Decision::Allowed(sluice_core::Allowed {
                remaining,
                reset_after: Duration::from_nanos(reset_after),
                delay: Duration::ZERO,
            }),
            None,
        )
    }
}

/// A key tracked by a synced rule: just its state, inline in the map's entry. The store key
/// is rebuilt from the rule id and the map key at flush time instead of being kept per key.
#[derive(Debug, Default)]
pub(crate) struct SyncedKey {
    pub state: Mutex<KeyState>,
}

impl SyncedKey {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, KeyState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One synced rule: its keys and parameters.
pub(crate) struct SyncedRule {
    pub params: SyncedParams,
    pub rule_id: Arc<str>,
    pub keys: HashMap<Box<str>, SyncedKey, FastHasher>,
}

/// What a flush needs to apply a reply to one key.
pub(crate) struct PendingFlush {
    /// The key's name in the rule's map.
    pub name: Box<str>,
    /// Index in the items of the carry item, if any.
    pub carry_item: Option<usize>,
    /// Index of the current-window item, if any.
    pub window_item: Option<usize>,
}

impl SyncedRule {
    pub(crate) fn new(params: SyncedParams, rule_id: Arc<str>) -> Self {
        Self {
            params,
            rule_id,
            keys: HashMap::builder()
                .hasher(FastHasher::default())
                .capacity(1024)
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
        }
    }

    /// Checks a request against the key `key` (an encoded descriptor).
    pub(crate) fn check(
        &self,
        key: &str,
        now: Nanos,
        cost: u64,
        store_ok: bool,
    ) -> (Decision, Option<Reason>) {
        let guard = self.keys.guard();
        let entry = match self.keys.get(key, &guard) {
            Some(k) => k,
            None => self
                .keys
                .get_or_insert_with(key.into(), SyncedKey::default, &guard),
        };
        entry.lock().check(&self.params, now, cost, store_ok)
    }

    /// Gives back `amount` for `key`. Counts not yet flushed are taken back exactly; beyond
    /// them the store already holds the count, so only this instance's own view is lowered
    /// (the global total stays conservative). Returns whether the key was tracked.
    pub(crate) fn refill(&self, key: &str, amount: u64) -> bool {
        let guard = self.keys.guard();
        let Some(k) = self.keys.get(key, &guard) else {
            return false;
        };
        let mut s = k.lock();
        let from_unflushed = amount.min(s.unflushed);
        s.unflushed -= from_unflushed;
        s.local = s.local.saturating_sub(amount);
        s.span_count = s.span_count.saturating_sub(amount);
        true
    }

    /// Snapshots every key with counts to send; removes idle keys. Returns the number evicted.
    pub(crate) fn prepare_flush(
        &self,
        now: Nanos,
        node: &Arc<str>,
        items: &mut Vec<FlushItem>,
        pending: &mut Vec<PendingFlush>,
    ) -> usize {
        let p = &self.params;
        let guard = self.keys.guard();
        let mut idle: Vec<Box<str>> = Vec::new();
        for (name, key) in self.keys.iter(&guard) {
            let mut s = key.lock();
            s.roll(p, now);
            let mut flush = PendingFlush {
                name: Box::default(),
                carry_item: None,
                window_item: None,
            };
            let mut store_key: Option<Arc<str>> = None;
            let mut store_key = || {
                store_key
                    .get_or_insert_with(|| {
                        sluice_store::CounterKey::from_encoded(&self.rule_id, name)
                            .as_str()
                            .into()
                    })
                    .clone()
            };
            if let Some((cw, cc)) = s.carry.take().map(WindowCount::pair) {
                flush.carry_item = Some(items.len());
                items.push(FlushItem {
                    key: store_key(),
                    window: cw,
                    delta: cc,
                    ttl: p.ttl(),
                    entry: None,
                    want_previous: false,
                    // The window's key may not exist yet (the store was down all along).
                    first_write: true,
                });
                s.carry_in_flight = Some(WindowCount::new(cw, cc));
            }
            if s.unflushed > 0 || s.offered > 0 {
                let elapsed = now.saturating_sub(s.rate_at);
                if elapsed > 0 {
                    let sample = s.offered as f64 / elapsed as f64;
                    s.rate = if s.rate == 0.0 {
                        sample
                    } else {
                        0.5 * s.rate + 0.5 * sample
                    };
                }
                s.offered = 0;
                s.rate_at = now;
                // Entries are exchanged on the key's first flush in a window and whenever the key
                // is shared: the last reply showed another instance (an entry, or counts no
                // entry accounts for), or a gap just ended. Alone, a flush only adds its count
                // (one command instead of three) and the total tells when someone else starts.
                let exchange = p.policy != Policy::Reactive
                    && (!s.prev_known || !s.others.is_empty() || s.cut_off || now <= s.grace_until);
                let entry = exchange.then(|| NodeEntry {
                    node: node.clone(),
                    count: s.local,
                    at_ms: now / 1_000_000,
                    rate_milli: (s.rate * 1e12) as u64,
                });
                flush.window_item = Some(items.len());
                items.push(FlushItem {
                    key: store_key(),
                    window: s.window,
                    delta: s.unflushed,
                    ttl: p.ttl(),
                    entry,
                    want_previous: !s.prev_known,
                    first_write: !s.prev_known,
                });
                s.in_flight = Some(WindowCount::new(s.window, s.unflushed));
                s.unflushed = 0;
            } else if s.carry_in_flight.is_none()
                && s.in_flight.is_none()
                && now.saturating_sub(s.last_hit) > 2 * p.window_ns
                && now >= s.blocked_until
            {
                idle.push(name.clone());
            }
            if flush.carry_item.is_some() || flush.window_item.is_some() {
                flush.name = name.clone();
                pending.push(flush);
            }
        }
        for name in &idle {
            self.keys.remove(name, &guard);
        }
        idle.len()
    }

    /// Applies a flush reply (or failure) to one key.
    pub(crate) fn apply(
        &self,
        pending: &PendingFlush,
        results: Option<&[Result<FlushOutcome, sluice_store::StoreError>]>,
        node: &str,
        now: Nanos,
    ) -> bool {
        let p = &self.params;
        let guard = self.keys.guard();
        let Some(key) = self.keys.get(&*pending.name, &guard) else {
            // Only idle keys are removed, and a key with counts in flight is not idle.
            return false;
        };
        let mut s = key.lock();
        let mut ok = true;
        if let (Some(i), Some((cw, cc))) = (
            pending.carry_item,
            s.carry_in_flight.take().map(WindowCount::pair),
        ) && !matches!(results.and_then(|r| r.get(i)), Some(Ok(_)))
        {
            ok = false;
            restore(&mut s, cw, cc);
        }
        let Some(i) = pending.window_item else {
            return ok;
        };
        let Some((fw, fc)) = s.in_flight.take().map(WindowCount::pair) else {
            return ok;
        };
        match results.and_then(|r| r.get(i)) {
            Some(Ok(outcome)) => {
                if s.cut_off {
                    s.cut_off = false;
                    s.grace_until = now.saturating_add(2 * p.span_ns);
                }
                s.heard_at = now;
                if fw == s.window {
                    s.global = outcome.total;
                    // Our own count as of the snapshot is in the total; what came after is not.
                    s.local_at_global = s.local - s.unflushed;
                    if let Some(previous) = outcome.previous_total {
                        s.prev_global = s.prev_global.max(previous);
                        s.prev_known = true;
                    }
                    let window_start = s.window * p.window_ns;
                    // What the total holds beyond our own count and every listed entry's.
                    let own = s.local_at_global;
                    let listed: u64 = outcome
                        .entries
                        .iter()
                        .filter(|e| &*e.node != node)
                        .map(|e| e.count)
                        .sum();
                    let unlisted = outcome.total.saturating_sub(own.saturating_add(listed));
                    let unlisted = (unlisted > 0 && p.policy != Policy::Reactive).then(|| Other {
                        node: UNLISTED.clone(),
                        count: unlisted,
                        at: now,
                        rate: unlisted as f64
                            / now.saturating_sub(window_start).max(p.span_ns) as f64,
                        unlisted: true,
                    });
                    if !outcome.entries.is_empty() {
                        s.seen_entries = true;
                        // An entry already stale when the store answers belongs to an instance
                        // that left: drop it, or the next window roll would re-date it and
                        // bring it back to life. After an outage every entry is old: keep them.
                        let grace = now <= s.grace_until;
                        let fresh = |at_ms: u64| {
                            grace
                                || now.saturating_sub(at_ms.saturating_mul(1_000_000))
                                    <= 2 * p.span_ns
                        };
                        let mut others: Vec<Other> = outcome
                            .entries
                            .iter()
                            .filter(|e| &*e.node != node && fresh(e.at_ms))
                            .map(|e| Other {
                                node: e.node.clone(),
                                count: e.count,
                                at: e.at_ms.saturating_mul(1_000_000),
                                rate: e.rate_milli as f64 / 1e12,
                                unlisted: false,
                            })
                            .collect();
                        // Instances known from the previous window that have not flushed in this
                        // one yet keep their carried rate until they go stale (one that did
                        // report, even stale, is judged by its report above). The unlisted
                        // counts are worked out afresh from each total.
                        for o in s.others.take() {
                            if !o.unlisted
                                && o.at <= window_start
                                && !outcome.entries.iter().any(|n| n.node == o.node)
                            {
                                others.push(o);
                            }
                        }
                        others.extend(unlisted);
                        s.others.set(others);
                    } else if s.seen_entries {
                        // A flush that only added its count: until now the key was ours alone,
                        // and anything beyond our count is someone else's.
                        let mut others = s.others.take();
                        others.retain(|o| !o.unlisted);
                        others.extend(unlisted);
                        s.others.set(others);
                    }
                    if outcome.total > p.limit {
                        s.block(p, now);
                    }
                    if p.budgets && s.seen_entries {
                        s.set_budget(p, now);
                    }
                } else if fw + 1 == s.window {
                    s.prev_global = s.prev_global.max(outcome.total);
                }
            }
            _ => {
                ok = false;
                s.cut_off = true;
                restore(&mut s, fw, fc);
            }
        }
        ok
    }

    pub(crate) fn key_info(&self, key: &str, now: Nanos) -> Option<crate::KeyInfo> {
        let guard = self.keys.guard();
        let k = self.keys.get(key, &guard)?;
        let mut s = k.lock();
        s.roll(&self.params, now);
        Some(crate::KeyInfo {
            rule_id: Arc::from(""),
            window: s.window,
            local: s.local,
            global: s.global,
            live_instances: s.live_others(&self.params, now) + 1,
            node_estimate: s.node_estimate(),
            estimate: s.estimate(&self.params, now, true),
            blocked_until: s.blocked_until,
            unflushed: s.unflushed + s.carry.map_or(0, |c| c.count),
        })
    }

    /// Live instances for the busiest key, blocked keys, and the largest node estimate.
    pub(crate) fn gauges(&self, now: Nanos) -> (usize, usize, u64) {
        let guard = self.keys.guard();
        let (mut live, mut blocked, mut nodes) = (0, 0, 1);
        for (_, key) in self.keys.iter(&guard) {
            let s = key.lock();
            live = live.max(s.live_others(&self.params, now) + 1);
            if s.blocked_until > now {
                blocked += 1;
            }
            nodes = nodes.max(s.node_estimate());
        }
        (live, blocked, nodes)
    }
}

/// Puts a count that did not reach the store back where the next flush picks it up.
fn restore(s: &mut KeyState, window: u64, count: u64) {
    if window == s.window {
        s.unflushed += count;
    } else if window + 1 == s.window {
        s.carry = Some(match s.carry.map(WindowCount::pair) {
            Some((cw, cc)) if cw == window => WindowCount::new(cw, cc + count),
            _ => WindowCount::new(window, count),
        });
    }
    // Older than the previous window: its key has expired in the store and no decision
    // depends on it any more.
}
