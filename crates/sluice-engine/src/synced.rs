//! `synced` mode (docs/SYNCED.md): counts in memory, one flush per span, and the
//! `reactive` (seed) and `predictive` policies.
//!
//! Memory per tracked key (docs/BENCHMARKS.md): one map entry holding the key's name (inline
//! up to 15 bytes) and its 52-byte [`Core`] behind a one-byte lock. Counts are 32-bit (as
//! Envoy's `requests_per_unit`; the config refuses larger limits) and times are 32-bit offsets
//! from the key's window start. What only keys counted by several instances need (the others'
//! entries, the demand budget, the grace after an outage) lives in a second map of [`Ext`]
//! values, entered only for those keys and only under the key's own lock.

use std::sync::Arc;
use std::time::Duration;

use ecow::EcoString;
use papaya::HashMap;
use parking_lot::Mutex;
use sluice_config::Policy;
use sluice_core::{Decision, Nanos};
use sluice_store::{FlushItem, FlushOutcome, NodeEntry};
use smallvec::SmallVec;

use crate::verdict::Reason;

type FastHasher = foldhash::fast::RandomState;

/// A rule's synced settings.
#[derive(Clone, Debug)]
pub(crate) struct SyncedParams {
    /// At most `u32::MAX` (the config refuses more): counts are 32-bit.
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

    fn window_start(&self, window: u64) -> Nanos {
        window.saturating_mul(self.window_ns)
    }

    /// The unit of the times a key keeps: `window / 2^28` (at least 1 ns), so a 32-bit offset
    /// from the window start reaches four windows either way (a cooldown is at most a window).
    fn unit_ns(&self) -> u64 {
        (self.window_ns >> 28).max(1)
    }
}

/// The name given to counts no entry accounts for (never compared with real node ids).
static UNLISTED: std::sync::LazyLock<Arc<str>> =
    std::sync::LazyLock::new(|| Arc::from("(unlisted)"));

/// Another instance's entry for a key. 32 bytes (asserted below): a shared key keeps one per
/// other instance, and one of them inline in its [`Ext`].
#[derive(Clone, Debug)]
struct Other {
    /// The instance's id, or [`UNLISTED`] itself (that allocation, see [`Other::unlisted`]).
    node: Arc<str>,
    /// When it flushed (store-corrected).
    at: Nanos,
    /// Its count in the window (saturating, like the totals).
    count: u32,
    /// Demand, hits per nanosecond.
    rate: f32,
}

const _: () = assert!(std::mem::size_of::<Other>() == 32);

impl Other {
    /// Counts in the window total that no entry accounts for: instances that do not publish
    /// entries (one alone on the key since the window began, a `reactive` one). Their rate is
    /// the count's average over the window so far. Told by the name's allocation, so no entry
    /// from the store can pass for it.
    fn unlisted(&self) -> bool {
        Arc::ptr_eq(&self.node, &UNLISTED)
    }
}

/// The others of a key: the usual shared key has one (two instances), kept inline.
type Others = SmallVec<[Other; 1]>;

/// Whether `cost` more fits one instance's share of the limit when `parties` instances split
/// it and none knows the others' counts (the store is unreachable, or a key's first span):
/// at most MAX/(parties x spans) in this span, rounded up so that a limit smaller than
/// `parties x spans` still admits one per span instead of nothing, and at most MAX/parties
/// (rounded up) in the window, so the rounding never adds up to more than the share.
fn fits_share(
    p: &SyncedParams,
    parties: u64,
    span_count: u64,
    window_count: u64,
    cost: u64,
) -> bool {
    let parties = parties.max(1);
    let per_span = p.limit.div_ceil(parties.saturating_mul(p.spans.max(1)));
    let per_window = p.limit.div_ceil(parties);
    span_count + cost <= per_span && window_count + cost <= per_window
}

fn sat32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// `Core::flags`.
const INIT: u16 = 1;
/// A reply for the key carried entries: the key's cold start is over.
const SEEN_ENTRIES: u16 = 1 << 1;
/// Whether the key is shared is settled: a reply showed another instance (its entry, or counts
/// no entry accounts for), or two replies with entries showed this instance alone (so
/// `SEEN_ENTRIES` without `SETTLED` means one such reply so far). One reply cannot tell:
/// instances that flush at the same span boundary right after this one are not in it yet, so
/// until then the key keeps exchanging entries (alone, it would send only its count and learn
/// of the others as one unlisted group, from a total a span old).
const SETTLED: u16 = 1 << 10;
/// The previous window's total has been read in this window.
const PREV_KNOWN: u16 = 1 << 2;
/// A flush of this key failed (the store was unreachable) and none has succeeded since.
const CUT_OFF: u16 = 1 << 3;
/// Counts of the key are in the flush in progress (they live in its [`PendingFlush`]).
const IN_FLIGHT: u16 = 1 << 4;
/// The key has an [`Ext`] in the rule's second map.
const HAS_EXT: u16 = 1 << 5;
/// `Core::span` holds a span.
const SPAN_SET: u16 = 1 << 6;
/// Three bits: the key was checked in its window, the one before, the one before that (idle
/// keys are evicted once all three are clear).
const HITS_SHIFT: u32 = 7;
const HITS: u16 = 0b111 << HITS_SHIFT;

/// One key's state, kept small (52 bytes, asserted below): the map holds one per tracked key.
/// Guarded by its own lock: different keys never contend.
#[derive(Debug, Default)]
pub(crate) struct Core {
    /// The window's number, its low 32 bits (the full number comes from the time of the call).
    window: u32,
    /// Admitted here in `window`.
    local: u32,
    /// Admitted here in `window` and not yet sent.
    unflushed: u32,
    /// The others' part of the window total read at the last flush (the total minus this
    /// instance's count at the moment of the read).
    others_read: u32,
    /// The previous window's totals (node estimate, sliding estimate).
    prev_global: u32,
    prev_local: u32,
    /// Admitted in the current span (`span`).
    span_count: u32,
    /// Hits offered (admitted or not) since the last flush.
    offered: u32,
    /// Counts of the previous window that never reached the store.
    carry: u32,
    /// Demand EWMA, hits per nanosecond.
    rate: f32,
    /// When the demand was last sampled: an offset from the window start in `unit_ns`.
    rate_at: i32,
    /// Blocked until (offset from the window start in `unit_ns`, rounded up); zero: not blocked.
    blocked: u32,
    /// The span of the last check: the low 16 bits of `now / span_ns`.
    span: u16,
    flags: u16,
}

const _: () = assert!(std::mem::size_of::<Core>() == 52);
// With the lock and the inline name, a map entry is 72 bytes: one 80-byte allocation.
const _: () = assert!(std::mem::size_of::<(EcoString, Mutex<Core>)>() == 72);

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

/// What a key counted by several instances adds: the others' entries, this instance's budget,
/// the grace after an outage. Lives in [`SyncedRule::ext`] while the key has others or a grace.
#[derive(Debug, Default)]
struct Ext {
    others: Others,
    /// Predictive: what this instance may admit until its next flush reply (its demand share
    /// of the room left in the window, at most the limit: a 32-bit count), and `local` when
    /// that share was set.
    budget: u32,
    local_at_budget: u32,
    /// Whether the budget was set in the current window.
    budget_set: bool,
    /// Sliding window: the share the budget was set with (the room the previous window's
    /// decaying weight frees afterwards is shared the same way), and when.
    budget_share: f32,
    budget_at: Nanos,
    /// After a gap in the store's replies, the others' entries count as live until this time:
    /// they could not refresh them either, and their counts from the gap are still on their way.
    grace_until: Nanos,
    /// When the store last answered a flush of this key.
    heard_at: Nanos,
}

// With the lock and the inline name, an extension map entry is 104 bytes: one 112-byte
// allocation, and none more for a key shared by two instances.
const _: () = assert!(std::mem::size_of::<(EcoString, Mutex<Ext>)>() == 104);

impl Ext {
    /// Whether another instance's entry is live: one that has not flushed for two spans has
    /// left. Judged now while this instance hears from the store about the key every span;
    /// otherwise as of when it last heard. Between replies an instance cannot know better, so
    /// it keeps extrapolating the others it knows of (an instance with little traffic for a
    /// key asks rarely; forgetting the others in the meantime would let it spend the whole
    /// limit on its own).
    fn fresh(&self, p: &SyncedParams, o: &Other, now: Nanos) -> bool {
        let judged_at = if now.saturating_sub(self.heard_at) < p.span_ns {
            now
        } else {
            self.heard_at
        };
        judged_at.saturating_sub(o.at) <= 2 * p.span_ns
    }

    fn live(&self, p: &SyncedParams, o: &Other, now: Nanos) -> bool {
        now <= self.grace_until || self.fresh(p, o, now)
    }

    fn live_others(&self, p: &SyncedParams, now: Nanos) -> usize {
        self.others.iter().filter(|o| self.live(p, o, now)).count()
    }
}

/// Sets a key's others, creating its extension if it has none and there are any.
fn set_others(ext: &mut Option<Ext>, mut others: Others, now: Nanos) {
    // Built by pushes, a list of two or more others would keep room for 4 or 8 for as long as
    // the key is shared (one other stays inline either way).
    others.shrink_to_fit();
    match ext {
        Some(x) => x.others = others,
        None if !others.is_empty() => {
            *ext = Some(Ext {
                others,
                heard_at: now,
                ..Ext::default()
            });
        }
        None => {}
    }
}

impl Core {
    fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// The key's window number, from the 32 bits kept and the window `w` of now.
    fn key_window(&self, w: u64) -> u64 {
        let behind = (w as u32).wrapping_sub(self.window) as i32;
        w.wrapping_sub(i64::from(behind) as u64)
    }

    fn blocked_until(&self, p: &SyncedParams, window_start: Nanos) -> Nanos {
        if self.blocked == 0 {
            return 0;
        }
        window_start.saturating_add(u64::from(self.blocked) * p.unit_ns())
    }

    fn set_blocked_until(&mut self, p: &SyncedParams, window_start: Nanos, until: Nanos) {
        self.blocked = sat32(until.saturating_sub(window_start).div_ceil(p.unit_ns()));
    }

    fn rate_at(&self, p: &SyncedParams, window_start: Nanos) -> Nanos {
        window_start
            .saturating_add_signed(i64::from(self.rate_at).saturating_mul(p.unit_ns() as i64))
    }

    fn set_rate_at(&mut self, p: &SyncedParams, window_start: Nanos, at: Nanos) {
        // Times are nanoseconds since the epoch: both fit an i64 until the year 2262.
        let offset = (at as i64)
            .saturating_sub(window_start as i64)
            .div_euclid(p.unit_ns() as i64);
        self.rate_at = offset.clamp(i32::MIN.into(), i32::MAX.into()) as i32;
    }

    fn roll(&mut self, p: &SyncedParams, ext: Option<&mut Ext>, w: u64, now: Nanos) {
        if !self.has(INIT) {
            self.flags |= INIT;
            self.window = w as u32;
            // Demand is measured from the key's first sight, not from the epoch.
            self.set_rate_at(p, p.window_start(w), now);
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
        self.blocked = 0;
        if blocked_until > start {
            self.set_blocked_until(p, start, blocked_until);
        }
        let rate_at = self.rate_at(p, old_start);
        self.set_rate_at(p, start, rate_at);
        let hits = if gap >= 3 {
            0
        } else {
            (self.flags & HITS) << gap & HITS
        };
        self.flags = (self.flags & !(HITS | PREV_KNOWN)) | hits;
        if gap >= 2 {
            // A whole window has passed: the span kept is not the current one, and after
            // 2^16 spans its low bits could look current.
            self.flags &= !SPAN_SET;
        }
        if let Some(ext) = ext {
            for other in &mut ext.others {
                // Carry each instance's demand rate into the new window (at the start of a
                // window the others' demand rates from the previous window are used).
                other.count = 0;
                other.at = start;
            }
            ext.budget_set = false;
        }
        self.window = w as u32;
        self.local = 0;
        self.unflushed = 0;
        self.others_read = 0;
    }

    /// The seed's node estimate: previous window's global / local, at least 1.
    fn node_estimate(&self) -> u64 {
        if self.prev_local == 0 {
            return 1;
        }
        u64::from(self.prev_global / self.prev_local).max(1)
    }

    /// Predictive estimate of the global count in the window at `now`.
    fn estimate(
        &self,
        p: &SyncedParams,
        ext: Option<&Ext>,
        window_start: Nanos,
        now: Nanos,
        store_ok: bool,
    ) -> f64 {
        let mut others = 0.0;
        if let Some(ext) = ext {
            for o in &ext.others {
                others += f64::from(o.count);
                // An entry not refreshed for two spans belongs to an instance that left; while
                // the store is silent nobody refreshes, so entries do not go stale then.
                if !store_ok || ext.live(p, o, now) {
                    others += f64::from(o.rate) * now.saturating_sub(o.at.max(window_start)) as f64;
                }
            }
        }
        let local = f64::from(self.local);
        // What this instance knows for sure: the total it read (its own count at that moment
        // included) plus what it admitted since.
        let mut estimate = (local + others).max(local + f64::from(self.others_read));
        if p.sliding {
            let elapsed = now.saturating_sub(window_start).min(p.window_ns);
            estimate += f64::from(self.prev_global) * (1.0 - elapsed as f64 / p.window_ns as f64);
        }
        estimate
    }

    /// Whether a shared key is far below its limit: the estimate, grown for two more spans at
    /// the key's known demand (this instance's rate and every live other's), stays under half
    /// the limit. Such a key needs no entries until it nears the limit (keys far
    /// below their limit may skip the per-node entries): the total `INCRBY` returns bounds the
    /// estimate from below, and the others count as one unlisted group meanwhile.
    fn far_below(&self, p: &SyncedParams, ext: &Ext, window_start: Nanos, now: Nanos) -> bool {
        if now <= ext.grace_until {
            // After an outage the entries are what tells the others' counts on their way.
            return false;
        }
        let rate = f64::from(self.rate)
            + ext
                .others
                .iter()
                .filter(|o| ext.live(p, o, now))
                .map(|o| f64::from(o.rate))
                .sum::<f64>();
        let grown =
            self.estimate(p, Some(ext), window_start, now, true) + rate * (2 * p.span_ns) as f64;
        grown < p.limit as f64 / 2.0
    }

    /// This instance's share of the key's demand (its rate over all live instances' rates).
    fn share(&self, p: &SyncedParams, ext: &Ext, now: Nanos) -> f64 {
        let rate = f64::from(self.rate);
        let (mut total, mut live) = (rate, 1.0);
        for o in &ext.others {
            if ext.live(p, o, now) {
                total += f64::from(o.rate);
                live += 1.0;
            }
        }
        if total > 0.0 {
            (rate / total).clamp(0.0, 1.0)
        } else {
            1.0 / live
        }
    }

    /// Sets this instance's budget until its next flush reply: its share of the room the
    /// estimate leaves in the window. Only keys with others have one: alone, the share is 1
    /// and the budget check is the estimate check.
    fn set_budget(&self, p: &SyncedParams, ext: &mut Ext, window_start: Nanos, now: Nanos) {
        let room = (p.limit as f64 - self.estimate(p, Some(ext), window_start, now, true)).max(0.0);
        let share = self.share(p, ext, now);
        // `room` is at most the limit, a 32-bit count (the cast saturates anyway).
        ext.budget = (room * share).floor() as u32;
        ext.local_at_budget = self.local;
        ext.budget_set = true;
        ext.budget_at = now;
        ext.budget_share = share as f32;
    }

    /// The budget now: with a sliding window it grows as the previous window's weight decays.
    fn budget_now(&self, p: &SyncedParams, ext: &Ext, window_start: Nanos, now: Nanos) -> u64 {
        if !p.sliding {
            return ext.budget.into();
        }
        // The decay since the budget was set, within this window.
        let from = ext.budget_at.max(window_start);
        let freed =
            f64::from(self.prev_global) * now.saturating_sub(from) as f64 / p.window_ns as f64;
        u64::from(ext.budget) + (freed * f64::from(ext.budget_share)).floor() as u64
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

    fn check(
        &mut self,
        p: &SyncedParams,
        mut ext: Option<&mut Ext>,
        now: Nanos,
        cost: u64,
        store_ok: bool,
    ) -> (Decision, Option<Reason>) {
        let w = now / p.window_ns;
        self.roll(p, ext.as_deref_mut(), w, now);
        let window_start = p.window_start(self.key_window(w));
        let span = now / p.span_ns;
        if !self.has(SPAN_SET) || (span as u16).wrapping_sub(self.span) as i16 > 0 {
            // A new span (spans only move forward).
            self.span = span as u16;
            self.flags |= SPAN_SET;
            self.span_count = 0;
        }
        let span_end = (span + 1).saturating_mul(p.span_ns);
        self.flags |= 1 << HITS_SHIFT;
        let window_end = window_start + p.window_ns;
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
        let cost32 = sat32(cost);
        self.offered = self.offered.saturating_add(cost32);
        let denied = |retry: Nanos| {
            Decision::Denied(sluice_core::Denied {
                retry_after: Duration::from_nanos(retry.max(1)),
                reset_after: Duration::from_nanos(reset_after),
            })
        };
        let blocked_until = self.blocked_until(p, window_start);
        if now < blocked_until {
            return (denied(blocked_until - now), Some(Reason::GlobalBlock));
        }
        let nodes = self.node_estimate();
        let span_count = u64::from(self.span_count);
        // The seed's fallback (and predictive's, for a key whose entries it never saw): while the
        // store is unreachable, at most MAX/N per span per instance (scaled by the node estimate).
        // Predictive, before the first reply for the key (an instance that just joined, or a
        // key it never saw): it knows nothing of the others yet, so until the reply comes (at
        // most a span) it keeps to the seed's fallback share, MAX/N per span with N the
        // instances it expects. No block: the reply lifts it.
        let seen_entries = self.has(SEEN_ENTRIES);
        let cold = p.policy != Policy::Reactive && p.budgets && !seen_entries && store_ok;
        let local = u64::from(self.local);
        if cold
            && p.expected_instances > 1
            && !fits_share(p, p.expected_instances, span_count, local, cost)
        {
            return (denied(span_end - now), Some(Reason::Fallback));
        }
        let use_fallback = !store_ok && (p.policy == Policy::Reactive || !seen_entries);
        if use_fallback && !fits_share(p, nodes, span_count, local, cost) {
            self.block(p, window_start, now);
            let until = self.blocked_until(p, window_start);
            return (denied(until.saturating_sub(now)), Some(Reason::Fallback));
        }
        let used = match p.policy {
            Policy::Reactive => {
                if (local + cost).saturating_mul(nodes) > p.limit {
                    return (denied(reset_after), Some(Reason::LocalBudget));
                }
                (local + u64::from(self.others_read)).max(local * nodes)
            }
            _ => {
                let estimate = self.estimate(p, ext.as_deref(), window_start, now, store_ok);
                if estimate + cost as f64 > p.limit as f64 {
                    return (denied(reset_after), Some(Reason::Estimate));
                }
                if p.budgets
                    && seen_entries
                    && let Some(ext) = ext
                {
                    if !ext.budget_set {
                        // A new window before this instance's first reply in it.
                        self.set_budget(p, ext, window_start, now);
                    }
                    let since = self.local.saturating_sub(ext.local_at_budget);
                    if u64::from(since) + cost > self.budget_now(p, ext, window_start, now) {
                        return (denied(reset_after), Some(Reason::Estimate));
                    }
                }
                estimate.ceil() as u64
            }
        };
        self.local = self.local.saturating_add(cost32);
        self.unflushed = self.unflushed.saturating_add(cost32);
        self.span_count = self.span_count.saturating_add(cost32);
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

/// One synced rule: its keys and parameters.
pub(crate) struct SyncedRule {
    pub params: SyncedParams,
    pub rule_id: Arc<str>,
    /// The tracked keys. The store key is rebuilt from the rule id and the name at flush time
    /// instead of being kept per key.
    pub keys: HashMap<EcoString, Mutex<Core>, FastHasher>,
    /// The [`Ext`] of the keys whose `HAS_EXT` flag is set; entered only under the key's lock.
    ext: HashMap<EcoString, Mutex<Ext>, FastHasher>,
}

/// What a flush needs to apply a reply to one key: the counts it sent, so that a failure puts
/// them back (the key keeps only an in-flight flag).
pub(crate) struct PendingFlush {
    /// The key's name in the rule's map.
    pub name: EcoString,
    /// The key's window when the flush was prepared.
    pub window: u64,
    /// Index in the items of the previous window's carried count, and that count.
    pub carry: Option<(usize, u32)>,
    /// Index of the current window's item, and its count.
    pub current: Option<(usize, u32)>,
}

impl SyncedRule {
    pub(crate) fn new(params: SyncedParams, rule_id: Arc<str>) -> Self {
        Self {
            params,
            rule_id,
            keys: HashMap::builder()
                .hasher(FastHasher::default())
                .capacity(1024)
                // Free a replaced table at once: with seize's default batch of 32 the (request) thread
                // that resized keeps the old table until it retires 31 more objects, i.e. for good.
                .collector(seize::Collector::new().batch_size(1))
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
            ext: HashMap::builder()
                .hasher(FastHasher::default())
                .capacity(64)
                .collector(seize::Collector::new().batch_size(1))
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
                .get_or_insert_with(EcoString::from(key), Mutex::default, &guard),
        };
        let mut core = entry.lock();
        if core.has(HAS_EXT) {
            let ext_guard = self.ext.guard();
            let mut ext = self.lock_ext(&core, key, &ext_guard);
            return core.check(&self.params, ext.as_deref_mut(), now, cost, store_ok);
        }
        core.check(&self.params, None, now, cost, store_ok)
    }

    /// Gives back `amount` for `key`. Counts not yet flushed are taken back exactly; beyond
    /// them the store already holds the count, so only this instance's own view is lowered
    /// (the global total stays conservative). Returns whether the key was tracked.
    pub(crate) fn refill(&self, key: &str, amount: u64) -> bool {
        let guard = self.keys.guard();
        let Some(k) = self.keys.get(key, &guard) else {
            return false;
        };
        let mut c = k.lock();
        let amount = sat32(amount);
        c.unflushed -= amount.min(c.unflushed);
        c.local = c.local.saturating_sub(amount);
        c.span_count = c.span_count.saturating_sub(amount);
        true
    }

    /// Snapshots every key with counts to send and removes idle keys, in one pass that also
    /// takes the rule's gauges.
    pub(crate) fn prepare_flush(
        &self,
        now: Nanos,
        node: &Arc<str>,
        items: &mut Vec<FlushItem>,
        pending: &mut Vec<PendingFlush>,
    ) -> Sweep {
        let p = &self.params;
        let w = now / p.window_ns;
        let guard = self.keys.guard();
        let ext_guard = self.ext.guard();
        let mut idle: Vec<EcoString> = Vec::new();
        let mut key_buf = String::with_capacity(128);
        let mut sweep = Sweep {
            live_instances: 1,
            node_estimate: 1,
            ..Sweep::default()
        };
        for (name, key) in self.keys.iter(&guard) {
            let mut c = key.lock();
            let mut ext = self.lock_ext(&c, name, &ext_guard);
            c.roll(p, ext.as_deref_mut(), w, now);
            let kw = c.key_window(w);
            let window_start = p.window_start(kw);
            sweep.live_instances = sweep
                .live_instances
                .max(ext.as_deref().map_or(0, |x| x.live_others(p, now)) + 1);
            sweep.blocked += usize::from(c.blocked_until(p, window_start) > now);
            sweep.node_estimate = sweep.node_estimate.max(c.node_estimate());
            let (mut carry, mut current) = (None, None);
            let mut store_key: Option<Arc<str>> = None;
            let mut store_key = || {
                store_key
                    .get_or_insert_with(|| {
                        key_buf.clear();
                        sluice_store::CounterKey::write_encoded(&mut key_buf, &self.rule_id, name);
                        key_buf.as_str().into()
                    })
                    .clone()
            };
            if c.carry > 0 {
                carry = Some((items.len(), c.carry));
                items.push(FlushItem {
                    key: store_key(),
                    window: kw - 1,
                    delta: c.carry.into(),
                    ttl: p.ttl(),
                    entry: None,
                    want_previous: false,
                    // The window's key may not exist yet (the store was down all along).
                    first_write: true,
                });
                c.carry = 0;
                c.flags |= IN_FLIGHT;
            }
            if c.unflushed > 0 || c.offered > 0 {
                let elapsed = now.saturating_sub(c.rate_at(p, window_start));
                if elapsed > 0 {
                    let sample = f64::from(c.offered) / elapsed as f64;
                    c.rate = if c.rate == 0.0 {
                        sample as f32
                    } else {
                        (0.5 * f64::from(c.rate) + 0.5 * sample) as f32
                    };
                }
                c.offered = 0;
                c.set_rate_at(p, window_start, now);
                // Entries are exchanged on the key's first flush in a window, until whether it is
                // shared is settled (`SETTLED`), and whenever the key is shared (the last reply
                // showed another instance: an entry, or counts no entry accounts for; or a gap
                // just ended) unless it is far below its limit. Otherwise a flush only adds its
                // count (one command instead of three) and the total tells when someone else
                // starts.
                let exchange = p.policy != Policy::Reactive
                    && (!c.has(PREV_KNOWN)
                        || !c.has(SETTLED)
                        || c.has(CUT_OFF)
                        || ext.as_deref().is_some_and(|x| {
                            (!x.others.is_empty() || now <= x.grace_until)
                                && !c.far_below(p, x, window_start, now)
                        }));
                let entry = exchange.then(|| NodeEntry {
                    node: node.clone(),
                    count: c.local.into(),
                    at_ms: now / 1_000_000,
                    rate_milli: (f64::from(c.rate) * 1e12) as u64,
                });
                current = Some((items.len(), c.unflushed));
                items.push(FlushItem {
                    key: store_key(),
                    window: kw,
                    delta: c.unflushed.into(),
                    ttl: p.ttl(),
                    entry,
                    want_previous: !c.has(PREV_KNOWN),
                    first_write: !c.has(PREV_KNOWN),
                });
                c.unflushed = 0;
                c.flags |= IN_FLIGHT;
            } else if !c.has(IN_FLIGHT)
                && c.flags & HITS == 0
                && now >= c.blocked_until(p, window_start)
            {
                idle.push(name.clone());
            }
            if carry.is_some() || current.is_some() {
                pending.push(PendingFlush {
                    name: name.clone(),
                    window: kw,
                    carry,
                    current,
                });
            }
        }
        for name in &idle {
            self.keys.remove(name, &guard);
            self.ext.remove(name, &ext_guard);
        }
        sweep.evicted = idle.len();
        sweep
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
        let Some(key) = self.keys.get(&pending.name, &guard) else {
            // Only idle keys are removed, and a key with counts in flight is not idle.
            return false;
        };
        let mut c = key.lock();
        c.flags &= !IN_FLIGHT;
        let kw = c.key_window(now / p.window_ns);
        let mut ok = true;
        if let Some((i, count)) = pending.carry
            && !matches!(results.and_then(|r| r.get(i)), Some(Ok(_)))
        {
            ok = false;
            c.restore(kw, pending.window - 1, count);
        }
        let Some((i, sent)) = pending.current else {
            return ok;
        };
        // The key's extension, taken out while the reply is applied (it is only ever touched
        // under the key's lock, which is held) and put back or dropped at the end.
        let ext_guard = self.ext.guard();
        let slot = if c.has(HAS_EXT) {
            self.ext.get(&pending.name, &ext_guard)
        } else {
            None
        };
        let mut ext: Option<Ext> = slot.map(|x| std::mem::take(&mut *x.lock()));
        match results.and_then(|r| r.get(i)) {
            Some(Ok(outcome)) => {
                if c.has(CUT_OFF) {
                    c.flags &= !CUT_OFF;
                    ext.get_or_insert_default().grace_until = now.saturating_add(2 * p.span_ns);
                }
                if let Some(x) = &mut ext {
                    x.heard_at = now;
                }
                if pending.window == kw {
                    self.apply_outcome(&mut c, &mut ext, outcome, node, kw, now);
                } else if pending.window + 1 == kw {
                    c.prev_global = c.prev_global.max(sat32(outcome.total));
                }
            }
            _ => {
                ok = false;
                c.flags |= CUT_OFF;
                c.restore(kw, pending.window, sent);
            }
        }
        // Keep the extension while the key has others or a grace; drop it after.
        match (ext, slot) {
            (Some(x), slot) if !x.others.is_empty() || now <= x.grace_until => {
                match slot {
                    Some(slot) => *slot.lock() = x,
                    None => {
                        self.ext
                            .insert(pending.name.clone(), Mutex::new(x), &ext_guard);
                    }
                }
                c.flags |= HAS_EXT;
            }
            (_, Some(_)) => {
                self.ext.remove(&pending.name, &ext_guard);
                c.flags &= !HAS_EXT;
            }
            _ => {}
        }
        ok
    }

    /// A reply for the key's current window: the total, the previous window's, the entries.
    fn apply_outcome(
        &self,
        c: &mut Core,
        ext: &mut Option<Ext>,
        outcome: &FlushOutcome,
        node: &str,
        kw: u64,
        now: Nanos,
    ) {
        let p = &self.params;
        let window_start = p.window_start(kw);
        // Our own count as of the snapshot is in the total; what came after is not.
        let own = u64::from(c.local.saturating_sub(c.unflushed));
        c.others_read = sat32(outcome.total.saturating_sub(own));
        if let Some(previous) = outcome.previous_total {
            c.prev_global = c.prev_global.max(sat32(previous));
            c.flags |= PREV_KNOWN;
        }
        // What the total holds beyond our own count and every listed entry's.
        let listed: u64 = outcome
            .entries
            .iter()
            .filter(|e| &*e.node != node)
            .map(|e| e.count)
            .sum();
        let unlisted = outcome.total.saturating_sub(own.saturating_add(listed));
        // Their rate: the average over the window so far, or, when this reply and the last one
        // in the window both had every other instance in the group (flushes that only added
        // their count), its growth since then if higher: a surge shows at once.
        let recent = match ext.as_ref().map(|x| x.others.as_slice()) {
            Some([o]) if outcome.entries.is_empty() && o.unlisted() && o.at > window_start => {
                unlisted.saturating_sub(o.count.into()) as f64
                    / now.saturating_sub(o.at).max(1) as f64
            }
            _ => 0.0,
        };
        let unlisted = (unlisted > 0 && p.policy != Policy::Reactive).then(|| Other {
            node: UNLISTED.clone(),
            count: sat32(unlisted),
            at: now,
            rate: (unlisted as f64 / now.saturating_sub(window_start).max(p.span_ns) as f64)
                .max(recent) as f32,
        });
        if !outcome.entries.is_empty() {
            let others_seen = listed > 0
                || unlisted.is_some()
                || outcome.entries.iter().any(|e| &*e.node != node);
            if others_seen || c.has(SEEN_ENTRIES) {
                c.flags |= SETTLED;
            }
            c.flags |= SEEN_ENTRIES;
            // An entry already stale when the store answers belongs to an instance that left:
            // drop it, or the next window roll would re-date it and bring it back to life.
            // After an outage every entry is old: keep them.
            let grace = ext.as_ref().is_some_and(|x| now <= x.grace_until);
            let fresh = |at_ms: u64| {
                grace || now.saturating_sub(at_ms.saturating_mul(1_000_000)) <= 2 * p.span_ns
            };
            let mut others: Others = outcome
                .entries
                .iter()
                .filter(|e| &*e.node != node && fresh(e.at_ms))
                .map(|e| Other {
                    node: e.node.clone(),
                    count: sat32(e.count),
                    at: e.at_ms.saturating_mul(1_000_000),
                    rate: (e.rate_milli as f64 / 1e12) as f32,
                })
                .collect();
            // Instances known from the previous window that have not flushed in this one yet
            // keep their carried rate until they go stale (one that did report, even stale, is
            // judged by its report above). The unlisted counts are worked out afresh from each
            // total.
            let known = ext.as_mut().map(|x| std::mem::take(&mut x.others));
            for o in known.into_iter().flatten() {
                if !o.unlisted()
                    && o.at <= window_start
                    && !outcome.entries.iter().any(|n| n.node == o.node)
                {
                    others.push(o);
                }
            }
            others.extend(unlisted);
            set_others(ext, others, now);
        } else if c.has(SEEN_ENTRIES) {
            // A flush that only added its count (the key was ours alone, or far below its
            // limit): anything beyond our count is someone else's, one unlisted group. The
            // entries known from before go: their counts are in that total too.
            let mut others = ext
                .as_mut()
                .map(|x| std::mem::take(&mut x.others))
                .unwrap_or_default();
            others.clear();
            others.extend(unlisted);
            set_others(ext, others, now);
        }
        if outcome.total > p.limit {
            c.block(p, window_start, now);
        }
        if p.budgets
            && c.has(SEEN_ENTRIES)
            && let Some(x) = ext
        {
            c.set_budget(p, x, window_start, now);
        }
    }

    /// The key's extension, locked, if it has one (the caller holds the key's lock).
    fn lock_ext<'g>(
        &self,
        core: &Core,
        name: &str,
        guard: &'g impl papaya::Guard,
    ) -> Option<parking_lot::MutexGuard<'g, Ext>> {
        core.has(HAS_EXT)
            .then(|| self.ext.get(name, guard).map(|x| x.lock()))
            .flatten()
    }

    pub(crate) fn key_info(&self, key: &str, now: Nanos) -> Option<crate::KeyInfo> {
        let p = &self.params;
        let guard = self.keys.guard();
        let mut c = self.keys.get(key, &guard)?.lock();
        let ext_guard = self.ext.guard();
        let mut ext = self.lock_ext(&c, key, &ext_guard);
        let w = now / p.window_ns;
        c.roll(p, ext.as_deref_mut(), w, now);
        let kw = c.key_window(w);
        let window_start = p.window_start(kw);
        Some(crate::KeyInfo {
            rule_id: Arc::from(""),
            window: kw,
            local: c.local.into(),
            others_read: c.others_read.into(),
            live_instances: ext.as_deref().map_or(0, |x| x.live_others(p, now)) + 1,
            node_estimate: c.node_estimate(),
            estimate: c.estimate(p, ext.as_deref(), window_start, now, true),
            blocked_until: c.blocked_until(p, window_start),
            unflushed: u64::from(c.unflushed) + u64::from(c.carry),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn rule(limit: u64, window_ns: u64, cooldown_ns: u64) -> SyncedRule {
        let params = SyncedParams {
            limit,
            window_ns,
            spans: 4,
            span_ns: window_ns / 4,
            cooldown_ns,
            policy: Policy::Predictive,
            sliding: false,
            budgets: true,
            expected_instances: 1,
        };
        SyncedRule::new(params, Arc::from("d/user"))
    }

    fn allowed(d: &(Decision, Option<Reason>)) -> bool {
        matches!(d.0, Decision::Allowed(_))
    }

    #[test]
    fn the_window_number_survives_its_low_32_bits_wrapping() {
        let core = Core {
            window: u32::MAX,
            ..Core::default()
        };
        let w = (1u64 << 32) + 1;
        assert_eq!(core.key_window(w), (1u64 << 32) - 1);
        let ahead = Core {
            window: 2,
            ..Core::default()
        };
        // A clock that went back: the key's window is ahead of now's.
        assert_eq!(ahead.key_window((1u64 << 32) + 1), (1u64 << 32) + 2);
    }

    #[test]
    fn a_cooldown_that_crosses_the_window_end_keeps_its_time() {
        let window = 60 * SECOND;
        let r = rule(10, window, 40 * SECOND);
        let t0 = 1_000 * window + 50 * SECOND;
        let mut items = Vec::new();
        let mut pending = Vec::new();
        assert!(allowed(&r.check("k", t0, 1, true)));
        r.prepare_flush(t0, &Arc::from("me"), &mut items, &mut pending);
        let outcome = FlushOutcome {
            total: 11,
            previous_total: Some(0),
            entries: Vec::new(),
        };
        r.apply(&pending[0], Some(&[Ok(outcome)]), "me", t0);
        // Blocked for 40 s from t0, i.e. 30 s into the next window.
        let (d, reason) = r.check("k", t0 + 39 * SECOND, 1, true);
        assert_eq!(reason, Some(Reason::GlobalBlock));
        let Decision::Denied(denied) = d else {
            panic!("{d:?}")
        };
        let retry = denied.retry_after.as_nanos() as u64;
        assert!((SECOND..SECOND + 1_000).contains(&retry), "{retry}");
        assert!(allowed(&r.check("k", t0 + 40 * SECOND + 1_000, 1, true)));
    }

    #[test]
    fn a_key_idle_for_years_of_spans_starts_afresh() {
        let window = SECOND;
        let r = rule(5, window, 0);
        let t0 = 1_000_000 * window;
        for _ in 0..5 {
            assert!(allowed(&r.check("k", t0, 1, true)));
        }
        assert!(!allowed(&r.check("k", t0, 1, true)));
        // 2^16 + 3 windows later (never swept): the span's low bits look the same as before,
        // the window's do not; nothing from the old window counts.
        let later = t0 + ((1 << 16) + 3) * window;
        for _ in 0..5 {
            assert!(allowed(&r.check("k", later, 1, true)));
        }
        let info = r.key_info("k", later).unwrap();
        assert_eq!((info.local, info.unflushed, info.blocked_until), (5, 5, 0));
    }

    #[test]
    fn totals_beyond_32_bits_saturate_and_block() {
        let r = rule(u64::from(u32::MAX), SECOND, 0);
        let t0 = 7 * SECOND;
        assert!(allowed(&r.check("k", t0, 1, true)));
        let mut items = Vec::new();
        let mut pending = Vec::new();
        r.prepare_flush(t0, &Arc::from("me"), &mut items, &mut pending);
        let outcome = FlushOutcome {
            total: u64::MAX,
            previous_total: Some(u64::MAX),
            entries: Vec::new(),
        };
        assert!(r.apply(&pending[0], Some(&[Ok(outcome)]), "me", t0));
        let (_, reason) = r.check("k", t0 + 1, 1, true);
        assert_eq!(reason, Some(Reason::GlobalBlock));
        let info = r.key_info("k", t0 + 1).unwrap();
        assert_eq!(info.others_read, u64::from(u32::MAX));
    }

    /// Another instance's entry as the store returns it: flushed at `at`, 1 hit a second.
    fn node_entry(node: &str, count: u64, at: Nanos) -> NodeEntry {
        NodeEntry {
            node: Arc::from(node),
            count,
            at_ms: at / 1_000_000,
            rate_milli: 1_000,
        }
    }

    #[test]
    fn only_shared_keys_have_an_extension_and_only_while_shared() {
        let window = 60 * SECOND;
        let r = rule(100, window, 0);
        let me: Arc<str> = Arc::from("me");
        let t0 = 100 * window;
        let flush = |t: Nanos, total: u64, entries: Vec<NodeEntry>| {
            let (mut items, mut pending) = (Vec::new(), Vec::new());
            r.prepare_flush(t, &me, &mut items, &mut pending);
            let outcome = FlushOutcome {
                total,
                previous_total: Some(0),
                entries,
            };
            assert!(r.apply(&pending[0], Some(&[Ok(outcome)]), "me", t));
        };
        assert!(r.check("alone", t0, 1, true).0.is_allowed());
        assert!(r.check("shared", t0, 1, true).0.is_allowed());
        let (mut items, mut pending) = (Vec::new(), Vec::new());
        r.prepare_flush(t0, &me, &mut items, &mut pending);
        let results: Vec<_> = items
            .iter()
            .map(|item| {
                let shared = item.key.contains("shared");
                Ok(FlushOutcome {
                    total: if shared { 11 } else { 1 },
                    previous_total: Some(0),
                    entries: if shared {
                        vec![node_entry("me", 1, t0), node_entry("other", 10, t0)]
                    } else {
                        vec![node_entry("me", 1, t0)]
                    },
                })
            })
            .collect();
        for p in &pending {
            assert!(r.apply(p, Some(&results), "me", t0));
        }
        assert_eq!(r.ext.len(), 1);
        assert_eq!(r.key_info("shared", t0).unwrap().live_instances, 2);
        assert_eq!(r.key_info("alone", t0).unwrap().live_instances, 1);
        // The other instance stops; three spans later its entry is stale and the extension goes.
        let t1 = t0 + 3 * (window / 4);
        // (Denied: this instance's demand share was 0 at the last reply, but the hit is
        // offered, so the key flushes.)
        assert!(!r.check("shared", t1, 1, true).0.is_allowed());
        flush(
            t1,
            11,
            vec![node_entry("me", 1, t1), node_entry("other", 10, t0)],
        );
        assert_eq!(r.ext.len(), 0);
        assert_eq!(r.key_info("shared", t1).unwrap().live_instances, 1);
    }

    #[test]
    fn a_shared_key_far_below_its_limit_sends_only_its_count_until_it_nears_half() {
        let window = 60 * SECOND;
        let span = window / 4;
        let r = rule(1000, window, 0);
        let me: Arc<str> = Arc::from("me");
        // The other instance: 1 hit a second.
        let other = |count: u64, at: Nanos| node_entry("other", count, at);
        // One hit, a second later a flush; returns whether it carried this instance's entry.
        let round = |t: Nanos, total: u64, entries: Vec<NodeEntry>| {
            assert!(r.check("k", t - SECOND, 1, true).0.is_allowed());
            let (mut items, mut pending) = (Vec::new(), Vec::new());
            r.prepare_flush(t, &me, &mut items, &mut pending);
            let sent_entry = items[0].entry.is_some();
            let outcome = FlushOutcome {
                total,
                previous_total: Some(0),
                entries,
            };
            assert!(r.apply(&pending[0], Some(&[Ok(outcome)]), "me", t));
            sent_entry
        };
        let t0 = 100 * window + SECOND;
        let mine = |count: u64, at: Nanos| node_entry("me", count, at);
        // The key's first flush in the window exchanges entries and finds the other.
        assert!(round(t0, 2, vec![mine(1, t0), other(1, t0)]));
        assert_eq!(r.key_info("k", t0).unwrap().live_instances, 2);
        // Far below 1000 (an estimate of ~18, growing ~30 in two spans): only the count goes;
        // the others become one unlisted group holding what the total shows beyond ours.
        assert!(!round(t0 + span, 40, vec![]));
        let info = r.key_info("k", t0 + span).unwrap();
        assert_eq!((info.others_read, info.live_instances), (38, 2));
        assert!(info.estimate >= 40.0, "{info:?}");
        // Two spans later the total is 600: past half the limit, the next flush exchanges
        // entries again.
        let t2 = t0 + 3 * span;
        assert!(!round(t2, 600, vec![]));
        // The others (597 of it) grew 559 in the two spans since the last reply: they are
        // extrapolated at that recent rate (18.6/s), not at their window average (13/s).
        let info = r.key_info("k", t2 + 5 * SECOND).unwrap();
        assert!(info.estimate > 685.0, "{info:?}");
        let t3 = t2 + 2 * SECOND;
        assert!(round(t3, 601, vec![mine(4, t3), other(597, t2)]));
        // A new window: the first flush exchanges entries whatever the count.
        let t4 = t0 + window;
        assert!(round(t4, 2, vec![mine(1, t4), other(1, t4)]));
    }

    #[test]
    fn an_instance_named_like_the_unlisted_group_is_still_an_instance() {
        // The unlisted group is told by its name's allocation, not its text: another instance
        // that happens to be called "(unlisted)" is carried into the next window like any other
        // (the group is worked out afresh from each total and would be dropped).
        let window = 60 * SECOND;
        let r = rule(1000, window, 0);
        let me: Arc<str> = Arc::from("me");
        let round = |t: Nanos, total: u64, entries: Vec<NodeEntry>| {
            assert!(r.check("k", t, 1, true).0.is_allowed());
            let (mut items, mut pending) = (Vec::new(), Vec::new());
            r.prepare_flush(t, &me, &mut items, &mut pending);
            assert!(
                items[0].entry.is_some(),
                "a window's first flush exchanges entries"
            );
            let outcome = FlushOutcome {
                total,
                previous_total: Some(0),
                entries,
            };
            assert!(r.apply(&pending[0], Some(&[Ok(outcome)]), "me", t));
        };
        let t0 = 100 * window + 50 * SECOND;
        round(
            t0,
            2,
            vec![
                node_entry("me", 1, t0),
                node_entry(&UNLISTED, 1, t0 - SECOND),
            ],
        );
        assert_eq!(r.key_info("k", t0).unwrap().live_instances, 2);
        // The next window's first flush, before the other flushed in it: still two.
        let t1 = 101 * window + SECOND;
        round(t1, 1, vec![node_entry("me", 1, t1)]);
        assert_eq!(r.key_info("k", t1).unwrap().live_instances, 2);
    }

    #[test]
    fn a_failed_flush_puts_its_counts_back_in_their_windows() {
        let window = 10 * SECOND;
        let r = rule(100, window, 0);
        let t0 = 50 * window + 9 * SECOND;
        for _ in 0..3 {
            assert!(r.check("k", t0, 1, true).0.is_allowed());
        }
        let mut items = Vec::new();
        let mut pending = Vec::new();
        r.prepare_flush(t0, &Arc::from("me"), &mut items, &mut pending);
        assert_eq!(r.key_info("k", t0).unwrap().unflushed, 0);
        // The reply fails after the window ended: the 3 go to the carry, counted once.
        let t1 = t0 + 2 * SECOND;
        assert!(r.check("k", t1, 1, false).0.is_allowed());
        assert!(!r.apply(&pending[0], None, "me", t1));
        let info = r.key_info("k", t1).unwrap();
        assert_eq!((info.local, info.unflushed), (1, 4));
        items.clear();
        pending.clear();
        r.prepare_flush(t1, &Arc::from("me"), &mut items, &mut pending);
        let sent: Vec<(u64, u64)> = items.iter().map(|i| (i.window, i.delta)).collect();
        assert_eq!(sent, [(50, 3), (51, 1)]);
    }
}
