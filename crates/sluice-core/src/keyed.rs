//! An in-memory limiter over many keys.

use std::hash::Hash;

use papaya::{Equivalent, HashMap, ResizeMode};

use crate::algorithm::Algorithm;
use crate::cell::StateCell;
use crate::clock::{Clock, Nanos};
use crate::coarse::CoarseClock;
use crate::decision::Decision;

type FastHasher = foldhash::fast::RandomState;

/// Many keys, one algorithm, one clock. Lookups of known keys are lock-free (a `papaya` map)
/// and a check writes only the key's own state, so threads never contend on shared memory
/// unless they hit the same key.
///
/// ```
/// use sluice_core::{Gcra, KeyedLimiter, ManualClock, Rate};
/// use std::num::NonZeroU64;
///
/// let clock = ManualClock::new(0);
/// let limiter = KeyedLimiter::with_clock(
///     Gcra::new(Rate::per_second(NonZeroU64::new(1).unwrap())),
///     clock.clone(),
/// );
/// assert!(limiter.check("alice", 1).is_allowed());
/// assert!(!limiter.check("alice", 1).is_allowed());
/// assert!(limiter.check("bob", 1).is_allowed());
/// ```
pub struct KeyedLimiter<K, A: Algorithm, C = CoarseClock>
where
    A: CellFor,
{
    algorithm: A,
    clock: C,
    map: HashMap<K, <A as CellFor>::Cell, FastHasher>,
}

/// Chooses the in-memory cell type for an algorithm's state.
pub trait CellFor: Algorithm {
    /// The cell that holds one key's state.
    type Cell: StateCell<Self::State>;
}

impl CellFor for crate::Gcra {
    type Cell = crate::cell::AtomicCell;
}
impl CellFor for crate::LeakyQueue {
    type Cell = crate::cell::AtomicCell;
}
impl CellFor for crate::LeakyBucket {
    type Cell = crate::cell::LockedCell<crate::LeakyBucketState>;
}
impl CellFor for crate::FixedWindow {
    type Cell = crate::cell::LockedCell<crate::FixedWindowState>;
}
impl CellFor for crate::SlidingWindow {
    type Cell = crate::cell::LockedCell<crate::SlidingWindowState>;
}
impl<A: CellFor> CellFor for crate::Cooldown<A> {
    type Cell = crate::cell::LockedCell<crate::CooldownState<A::State>>;
}
impl CellFor for crate::SlidingLog {
    type Cell = crate::cell::LockedCell<crate::SlidingLogState>;
}

const DEFAULT_CAPACITY: usize = 1024;

impl<K, A> KeyedLimiter<K, A, CoarseClock>
where
    K: Hash + Eq + Send + Sync,
    A: CellFor,
{
    /// A limiter on the default [`CoarseClock`] (millisecond resolution, one atomic load per
    /// read); use [`KeyedLimiter::with_clock`] with a [`crate::SystemClock`] for a precise one.
    pub fn new(algorithm: A) -> Self {
        Self::with_clock(algorithm, CoarseClock::new())
    }
}

impl<K, A, C> KeyedLimiter<K, A, C>
where
    K: Hash + Eq + Send + Sync,
    A: CellFor,
    C: Clock,
{
    /// A limiter on `clock`, presized for a thousand keys.
    pub fn with_clock(algorithm: A, clock: C) -> Self {
        Self::with_capacity(algorithm, clock, DEFAULT_CAPACITY)
    }

    /// A limiter presized for `capacity` keys, so that growth does not stall checks.
    pub fn with_capacity(algorithm: A, clock: C, capacity: usize) -> Self {
        let map = HashMap::builder()
            .hasher(FastHasher::default())
            .capacity(capacity)
            .resize_mode(ResizeMode::Blocking)
            // Free a replaced table at once: with seize's default batch of 32 the (request) thread
            // that resized keeps the old table until it retires 31 more objects, i.e. for good.
            .collector(seize::Collector::new().batch_size(1))
            .build();
        Self {
            algorithm,
            clock,
            map,
        }
    }

    /// Checks `cost` units for `key` now.
    #[inline]
    pub fn check<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        Q: Hash + Equivalent<K> + ToOwned<Owned = K> + ?Sized,
    {
        self.check_at(key, self.clock.now(), cost)
    }

    /// Checks `cost` units for `key` at `now`.
    #[inline]
    pub fn check_at<Q>(&self, key: &Q, now: Nanos, cost: u64) -> Decision
    where
        Q: Hash + Equivalent<K> + ToOwned<Owned = K> + ?Sized,
    {
        let algorithm = &self.algorithm;
        let guard = self.map.guard();
        let cell = match self.map.get(key, &guard) {
            Some(cell) => cell,
            None => {
                if cost > algorithm.capacity() {
                    return algorithm.check(Default::default(), now, cost).0;
                }
                self.map
                    .get_or_insert_with(key.to_owned(), Default::default, &guard)
            }
        };
        cell.transition(|state| algorithm.check(state, now, cost))
    }

    /// Checks `cost` units for `key` now if the key is tracked; `None` (nothing checked, nothing
    /// stored) if it is not. One lookup for a caller that admits new keys itself (a bounded
    /// key set): a tracked key, the usual case, is decided without a second one.
    #[inline]
    pub fn check_tracked<Q>(&self, key: &Q, cost: u64) -> Option<Decision>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        let now = self.clock.now();
        let guard = self.map.guard();
        let cell = self.map.get(key, &guard)?;
        Some(cell.transition(|state| self.algorithm.check(state, now, cost)))
    }

    /// Gives back `amount` units to `key` (see [`Algorithm::refill`]); an untracked key already
    /// has its whole quota. Returns whether the key was tracked.
    pub fn refill_at<Q>(&self, key: &Q, now: Nanos, amount: u64) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        let guard = self.map.guard();
        let Some(cell) = self.map.get(key, &guard) else {
            return false;
        };
        cell.transition(|state| ((), self.algorithm.refill(state, now, amount)));
        true
    }

    /// Forgets keys whose state is the same as a fresh key's at `now`; returns how many.
    /// Decisions are unchanged by this; only memory is freed.
    pub fn evict_idle(&self, now: Nanos) -> usize {
        let guard = self.map.guard();
        let before = self.map.len();
        self.map.retain(
            |_, cell| {
                !cell.transition(|state| {
                    let idle = self.algorithm.is_idle(&state, now);
                    (idle, state)
                })
            },
            &guard,
        );
        before.saturating_sub(self.map.len())
    }

    /// Takes over the keys of `from` (a limiter built for settings a reload replaced): each
    /// key's state, as `carry` maps it, unless it is idle at `now` or `carry` says it starts
    /// over. Returns how many keys carried over.
    pub fn carry_from<B, C2>(
        &self,
        from: &KeyedLimiter<K, B, C2>,
        now: Nanos,
        carry: impl Fn(B::State) -> Option<A::State>,
    ) -> usize
    where
        K: Clone,
        A::State: Clone,
        B: CellFor,
        B::State: Clone,
    {
        let mut carried = 0;
        let (theirs, ours) = (from.map.pin(), self.map.pin());
        for (key, cell) in theirs.iter() {
            let state = cell.transition(|s| (s.clone(), s));
            if from.algorithm.is_idle(&state, now) {
                continue;
            }
            if let Some(state) = carry(state) {
                let cell = <A as CellFor>::Cell::default();
                cell.transition(|_| ((), state.clone()));
                ours.insert(key.clone(), cell);
                carried += 1;
            }
        }
        carried
    }

    /// Forgets `key` (it starts over as a fresh key); returns whether it was tracked.
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.map.remove(key, &self.map.guard()).is_some()
    }

    /// Whether `key` is tracked.
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.map.contains_key(key, &self.map.guard())
    }

    /// Number of keys tracked.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The algorithm in use.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock in use.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FixedWindow, ManualClock, Rate, SlidingLog};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn keys_are_independent_and_evicted_when_idle() {
        let clock = ManualClock::new(0);
        let rate = Rate::new(2, Duration::from_secs(1)).unwrap();
        let limiter: KeyedLimiter<String, _, _> =
            KeyedLimiter::with_clock(FixedWindow::new(rate), clock.clone());
        for key in ["a", "b"] {
            assert!(limiter.check(key, 2).is_allowed());
            assert!(!limiter.check(key, 1).is_allowed());
        }
        assert_eq!(limiter.len(), 2);
        assert_eq!(limiter.evict_idle(clock.now()), 0);
        clock.advance(Duration::from_secs(1));
        assert_eq!(limiter.evict_idle(clock.now()), 2);
        assert!(limiter.is_empty());
    }

    #[test]
    fn a_check_of_tracked_keys_only_decides_nothing_for_an_untracked_one() {
        let rate = Rate::new(2, Duration::from_secs(1)).unwrap();
        let limiter: KeyedLimiter<String, _, _> =
            KeyedLimiter::with_clock(FixedWindow::new(rate), ManualClock::new(0));
        assert!(limiter.check_tracked("a", 1).is_none());
        assert!(limiter.is_empty());
        assert!(limiter.check("a", 1).is_allowed());
        assert!(
            limiter
                .check_tracked("a", 1)
                .is_some_and(|d| d.is_allowed())
        );
        assert!(
            limiter
                .check_tracked("a", 1)
                .is_some_and(|d| !d.is_allowed())
        );
        assert_eq!(limiter.len(), 1);
    }

    #[test]
    fn insufficient_capacity_does_not_track_the_key() {
        let rate = Rate::new(2, Duration::from_secs(1)).unwrap();
        let limiter: KeyedLimiter<String, _, _> =
            KeyedLimiter::with_clock(SlidingLog::new(rate), ManualClock::new(0));
        assert!(matches!(
            limiter.check("a", 3),
            Decision::InsufficientCapacity(_)
        ));
        assert!(limiter.is_empty());
    }

    #[test]
    fn concurrent_checks_on_one_key_never_over_admit() {
        let rate = Rate::new(1000, Duration::from_secs(3600)).unwrap();
        let limiter: Arc<KeyedLimiter<u64, _, _>> = Arc::new(KeyedLimiter::with_clock(
            crate::Gcra::new(rate),
            ManualClock::new(1),
        ));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                std::thread::spawn(move || {
                    (0..1000)
                        .filter(|_| limiter.check(&7, 1).is_allowed())
                        .count()
                })
            })
            .collect();
        let admitted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(admitted, 1000);
    }
}
