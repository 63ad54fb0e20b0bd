use std::time::Duration;

use crate::algorithm::{Algorithm, mul_ns};
use crate::clock::{Nanos, duration_to_nanos};
use crate::decision::{Allowed, Decision};
use crate::rate::Rate;

/// Leaky bucket as a meter: a bucket of `capacity` units that leaks at the rate; a request
/// that would overflow it is denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakyBucket {
    drain_ns: u64,
    capacity: u64,
}

/// State of a [`LeakyBucket`]: the bucket's level, in nanoseconds of draining, as of `updated`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeakyBucketState {
    /// When the level was last computed.
    pub updated: Nanos,
    /// Time needed to drain the bucket completely, as of `updated`.
    pub level_ns: u64,
}

impl LeakyBucket {
    /// A bucket of `capacity` units (at least 1) draining at `rate`.
    pub fn new(rate: Rate, capacity: u64) -> Self {
        Self {
            drain_ns: rate.emission_interval_ns(),
            capacity: capacity.max(1),
        }
    }
}

impl Algorithm for LeakyBucket {
    type State = LeakyBucketState;

    #[inline]
    fn check(
        &self,
        state: LeakyBucketState,
        now: Nanos,
        cost: u64,
    ) -> (Decision, LeakyBucketState) {
        if cost > self.capacity {
            return (Decision::insufficient(cost, self.capacity), state);
        }
        // A clock that went backwards drains nothing and never refills the bucket.
        let at = now.max(state.updated);
        let level = state.level_ns.saturating_sub(at - state.updated);
        let full_ns = mul_ns(self.capacity, self.drain_ns);
        let new_level = level.saturating_add(mul_ns(cost, self.drain_ns));
        let lag = at - now;
        if new_level > full_ns {
            let retry = new_level - full_ns + lag;
            return (Decision::denied(retry, level + lag), state);
        }
        let remaining = (full_ns - new_level) / self.drain_ns;
        let next = LeakyBucketState {
            updated: at,
            level_ns: new_level,
        };
        if cost == 0 {
            return (Decision::allowed(remaining, level + lag), state);
        }
        (Decision::allowed(remaining, new_level + lag), next)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn refill(&self, state: LeakyBucketState, _now: Nanos, amount: u64) -> LeakyBucketState {
        LeakyBucketState {
            level_ns: state.level_ns.saturating_sub(mul_ns(amount, self.drain_ns)),
            ..state
        }
    }

    fn is_idle(&self, state: &LeakyBucketState, now: Nanos) -> bool {
        state.updated.saturating_add(state.level_ns) <= now
    }

    fn carry(&self, from: &Self, state: LeakyBucketState, now: Nanos) -> Option<LeakyBucketState> {
        let at = now.max(state.updated);
        let level = state.level_ns.saturating_sub(at - state.updated);
        let empty_at =
            crate::algorithm::rescale(at.saturating_add(level), at, from.drain_ns, self.drain_ns);
        Some(LeakyBucketState {
            updated: at,
            level_ns: empty_at - at,
        })
    }
}

/// Leaky bucket as a queue: requests are never denied while the queue has room; each gets a
/// delay that spaces them out at the rate. A request that would wait longer than `max_delay`
/// is denied.
///
/// The state is the time the queue is empty again. A request of cost `n` starts leaving at
/// `max(free_at, now)` (its delay) and occupies the outlet for `n` emission intervals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakyQueue {
    drain_ns: u64,
    max_delay_ns: u64,
}

impl LeakyQueue {
    /// A queue draining at `rate` that delays requests by at most `max_delay`.
    pub fn new(rate: Rate, max_delay: Duration) -> Self {
        Self {
            drain_ns: rate.emission_interval_ns(),
            max_delay_ns: duration_to_nanos(max_delay),
        }
    }

    /// The time between two units leaving the queue.
    pub fn drain_interval_ns(&self) -> u64 {
        self.drain_ns
    }

    /// The longest delay handed out.
    pub fn max_delay(&self) -> Duration {
        Duration::from_nanos(self.max_delay_ns)
    }
}

impl Algorithm for LeakyQueue {
    type State = Nanos;

    #[inline]
    fn check(&self, free_at: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
        let capacity = self.capacity();
        if cost > capacity {
            return (Decision::insufficient(cost, capacity), free_at);
        }
        let start = free_at.max(now);
        let delay = start - now;
        if delay > self.max_delay_ns {
            let retry = delay - self.max_delay_ns;
            return (Decision::denied(retry, delay), free_at);
        }
        let new_free = start.saturating_add(mul_ns(cost, self.drain_ns));
        let next_delay = new_free - now;
        let remaining = if next_delay > self.max_delay_ns {
            0
        } else {
            (self.max_delay_ns - next_delay) / self.drain_ns + 1
        };
        let decision = Decision::Allowed(Allowed {
            remaining,
            reset_after: Duration::from_nanos(next_delay),
            delay: Duration::from_nanos(delay),
        });
        (decision, if cost == 0 { free_at } else { new_free })
    }

    fn capacity(&self) -> u64 {
        self.max_delay_ns / self.drain_ns + 1
    }

    fn refill(&self, free_at: Nanos, now: Nanos, amount: u64) -> Nanos {
        free_at
            .saturating_sub(mul_ns(amount, self.drain_ns))
            .max(now.min(free_at))
    }

    fn is_idle(&self, free_at: &Nanos, now: Nanos) -> bool {
        *free_at <= now
    }

    fn carry(&self, from: &Self, free_at: Nanos, now: Nanos) -> Option<Nanos> {
        Some(crate::algorithm::rescale(
            free_at,
            now,
            from.drain_ns,
            self.drain_ns,
        ))
    }
}
