//! Rate-limiting algorithms as pure state transitions.
//!
//! Each algorithm is a small configuration value implementing [`Algorithm`]: given the previous
//! state of one key, the current time and the request's cost, it returns the [`Decision`] and
//! the next state. Nothing here reads a clock or touches shared memory; the caller (the keyed
//! limiter, a store, a Lua script mirroring the same math) decides how the update is made atomic.

mod cooldown;
mod fixed_window;
mod gcra;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;

pub use cooldown::{Cooldown, CooldownState};
pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::Gcra;
pub use leaky_bucket::{LeakyBucket, LeakyBucketState, LeakyQueue};
pub use sliding_log::{SlidingLog, SlidingLogState};
pub use sliding_window::{SlidingWindow, SlidingWindowState};

use crate::clock::Nanos;
use crate::decision::Decision;

/// A rate-limiting algorithm: a pure function `(state, now, cost) -> (decision, state)`.
pub trait Algorithm: Send + Sync {
    /// Per-key state. `Default` is the state of a key never seen.
    type State: Default + Send;

    /// Decides one request of `cost` units at time `now`.
    ///
    /// A cost of zero is a query: it reports the current state and never changes it.
    fn check(&self, state: Self::State, now: Nanos, cost: u64) -> (Decision, Self::State);

    /// The largest cost admitted at once; larger costs get
    /// [`Decision::InsufficientCapacity`].
    fn capacity(&self) -> u64;

    /// Gives back `amount` units that were admitted but not used (an API client that acquired
    /// more than it needed). Never raises the available quota above a fresh key's.
    fn refill(&self, state: Self::State, now: Nanos, amount: u64) -> Self::State;

    /// Whether a key in `state` is indistinguishable from a key never seen at `now`, so that it
    /// can be forgotten without changing any future decision.
    fn is_idle(&self, state: &Self::State, now: Nanos) -> bool;

    /// A key's `state` under `from`'s settings, as a state of this algorithm's: what the key
    /// has used carried over (a reload that changes a limit). `None` when nothing carries
    /// (another window length): the key starts over.
    fn carry(&self, from: &Self, state: Self::State, now: Nanos) -> Option<Self::State> {
        let _ = (from, state, now);
        None
    }
}

/// A time `point` ahead of `now` measured in `from_ns` units, rescaled to `to_ns` units (a
/// bucket's backlog under a new rate); a point at or before `now` stays.
pub(crate) fn rescale(point: Nanos, now: Nanos, from_ns: u64, to_ns: u64) -> Nanos {
    if point <= now || from_ns == 0 {
        return point;
    }
    let ahead = u128::from(point - now) * u128::from(to_ns) / u128::from(from_ns);
    now.saturating_add(u64::try_from(ahead).unwrap_or(u64::MAX))
}

/// Saturating `a * b` in nanoseconds.
#[inline]
pub(crate) fn mul_ns(a: u64, b: u64) -> u64 {
    a.saturating_mul(b)
}
