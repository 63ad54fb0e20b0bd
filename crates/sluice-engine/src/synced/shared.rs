//! What a key counted by several instances adds to its state: the others' entries, this
//! instance's budget, the grace after an outage.

use std::sync::{Arc, LazyLock};

use ecow::EcoString;
use parking_lot::Mutex;
use sluice_core::Nanos;
use smallvec::SmallVec;

use super::params::SyncedParams;
use super::time::Demand;

/// The name given to counts no entry accounts for (never compared with real node ids).
static UNLISTED: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("(unlisted)"));

/// Another instance's entry for a key. 32 bytes (asserted below): a shared key keeps one per
/// other instance, and one of them inline in its [`Shared`].
#[derive(Clone, Debug)]
pub(crate) struct Other {
    /// The instance's id, or [`UNLISTED`] itself (that allocation, see [`Other::unlisted`]).
    pub node: Arc<str>,
    /// When it flushed (store-corrected).
    pub at: Nanos,
    /// Its count in the window (saturating, like the totals).
    pub count: u32,
    pub demand: Demand,
}

const _: () = assert!(std::mem::size_of::<Other>() == 32);

impl Other {
    /// Counts in the window total that no entry accounts for: instances that do not publish
    /// entries (one alone on the key since the window began, a `reactive` one).
    pub(crate) fn unlisted_group(count: u32, at: Nanos, demand: Demand) -> Self {
        Self {
            node: UNLISTED.clone(),
            at,
            count,
            demand,
        }
    }

    /// Whether this is the unlisted group. Told by the name's allocation, so no entry from
    /// the store can pass for it.
    pub(crate) fn unlisted(&self) -> bool {
        Arc::ptr_eq(&self.node, &UNLISTED)
    }
}

/// The others of a key: the usual shared key has one (two instances), kept inline.
pub(crate) type Others = SmallVec<[Other; 1]>;

/// Predictive: what this instance may admit until its next flush reply.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Budget {
    /// Its demand share of the room left in the window, at most the limit: a 32-bit count.
    pub amount: u32,
    /// The key's local count when the budget was set.
    pub local_at: u32,
    /// Sliding window: the share the budget was set with (the room the previous window's
    /// decaying weight frees afterwards is shared the same way), and when.
    pub share: f32,
    pub at: Nanos,
    /// Whether the count it was set from may lack the others' flushes of its boundary.
    pub read: Read,
    /// Split evenly over the fleet ([`super::model::Split::Even`], or a key far below its
    /// limit): the rates in hand said nothing of how the instances' demand is spread.
    pub even: bool,
    /// Set in the key's current window (cleared when the window rolls). Kept here rather than
    /// as an `Option` around the budget: it fills the struct's padding instead of adding 8
    /// bytes a key.
    pub(super) current: bool,
}

/// Whether the count a budget was set from holds the others' latest flushes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Read {
    /// As far as this instance can tell.
    #[default]
    Complete,
    /// A reply to a span-boundary flush that may have come before the others' flushes of the
    /// same boundary, and no early sync read them after it.
    BeforeOthers,
}

/// A shared key's extra state. Lives in the rule's second map while the key has others or a
/// grace, and is only touched under the key's own lock.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub others: Others,
    /// This instance's budget (see [`Shared::budget`]).
    budget: Budget,
    /// After a gap in the store's replies, the others' entries count as live until this time:
    /// they could not refresh them either, and their counts from the gap are still on their way.
    pub grace_until: Nanos,
    /// When the store last answered a flush of this key.
    pub heard_at: Nanos,
}

// With the lock and the inline name, a second-map entry is 104 bytes: one 112-byte
// allocation, and none more for a key shared by two instances.
const _: () = assert!(std::mem::size_of::<(EcoString, Mutex<Shared>)>() == 104);

impl Shared {
    /// Empty, heard from at `now` (a key whose others are not listed yet).
    pub(crate) fn heard_at(now: Nanos) -> Self {
        Self {
            heard_at: now,
            ..Self::default()
        }
    }

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

    pub(crate) fn live(&self, p: &SyncedParams, o: &Other, now: Nanos) -> bool {
        self.in_grace(now) || self.fresh(p, o, now)
    }

    /// Until when another instance is known to have counted nothing since its entry. An
    /// instance flushes a key at the first span boundary after it counts it, with its entry
    /// unless the key is far below its limit (and then its count is in the total read). So
    /// one whose entry is older than the last boundary whose flushes had all landed when this
    /// instance last heard from the store ([`SyncedParams::settle_margin`] before then: a
    /// reply may come well after its read, a chunked flush reads its last keys last)
    /// counted nothing between its entry and that boundary: its demand is taken from the
    /// boundary on, not over the quiet it kept (a client that bursts every few seconds,
    /// between bursts, was refused its next burst for demand extrapolated over the gap).
    pub(crate) fn quiet_until(&self, p: &SyncedParams, o: &Other) -> Nanos {
        // After an outage the others' counts from the gap are still on their way: their
        // silence then says nothing.
        if o.unlisted() || self.in_grace(o.at.max(self.heard_at)) {
            return o.at;
        }
        let landed = self.heard_at.saturating_sub(p.settle_margin());
        o.at.max(p.span_of(landed).saturating_mul(p.span_ns))
    }

    pub(crate) fn in_grace(&self, now: Nanos) -> bool {
        now <= self.grace_until
    }

    pub(crate) fn live_others(&self, p: &SyncedParams, now: Nanos) -> impl Iterator<Item = &Other> {
        self.others.iter().filter(move |o| self.live(p, o, now))
    }

    /// Whether it still has a reason to be kept: others, or a grace.
    pub(crate) fn needed(&self, now: Nanos) -> bool {
        !self.others.is_empty() || self.in_grace(now)
    }

    /// A reply that read the window total without entries (an early sync): the others
    /// together hold `others_total` at `now`. Their counts since their entries (what the
    /// total holds beyond the listed counts) go to the live ones in proportion to their
    /// demand, and their entries count as of now, so that nobody is extrapolated twice.
    pub(crate) fn rebase(&mut self, p: &SyncedParams, others_total: u64, now: Nanos) {
        let live: Vec<usize> = (0..self.others.len())
            .filter(|&i| self.live(p, &self.others[i], now))
            .collect();
        let listed: u64 = self.others.iter().map(|o| u64::from(o.count)).sum();
        let (Some(extra), false) = (others_total.checked_sub(listed), live.is_empty()) else {
            return;
        };
        let rates: f64 = live.iter().map(|&i| self.others[i].demand.per_ns()).sum();
        let mut left = extra;
        for (n, &i) in live.iter().enumerate() {
            let o = &mut self.others[i];
            let part = if n + 1 == live.len() {
                left
            } else if rates > 0.0 {
                ((extra as f64 * o.demand.per_ns() / rates) as u64).min(left)
            } else {
                (extra / live.len() as u64).min(left)
            };
            left -= part;
            o.count = u32::try_from(u64::from(o.count) + part).unwrap_or(u32::MAX);
            o.at = now;
        }
    }

    /// A new window: each instance's demand carries into it (at the start of a window the
    /// others' demand from the previous window is used), their counts start over.
    pub(crate) fn roll(&mut self, window_start: Nanos) {
        for other in &mut self.others {
            other.count = 0;
            other.at = window_start;
        }
        self.budget.current = false;
    }

    /// The budget set in the current window, if any.
    pub(crate) fn budget(&self) -> Option<Budget> {
        self.budget.current.then_some(self.budget)
    }

    pub(crate) fn set_budget(&mut self, budget: Budget) {
        self.budget = Budget {
            current: true,
            ..budget
        };
    }
}

/// Sets a key's others, creating its shared state if it has none and there are any.
pub(crate) fn set_others(shared: &mut Option<Shared>, mut others: Others, now: Nanos) {
    // Built by pushes, a list of two or more others would keep room for 4 or 8 for as long as
    // the key is shared (one other stays inline either way).
    others.shrink_to_fit();
    match shared {
        Some(x) => x.others = others,
        None if !others.is_empty() => {
            *shared = Some(Shared {
                others,
                heard_at: now,
                ..Shared::default()
            });
        }
        None => {}
    }
}
