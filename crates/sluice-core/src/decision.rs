//! The outcome of a check. Being limited is a value, not an error.

use std::time::Duration;

/// The largest cost one request may carry, at every front door (gRPC `hits_addend`, `/json`,
/// `/v1/acquire`'s `amount`, gateway route costs) and in the engine. A cap this far below
/// `u64::MAX` keeps every sum of costs and counts far from overflow, so no cost can wrap a
/// counter back under its limit.
pub const MAX_COST: u64 = 1_000_000_000;

/// What a limiter decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The request may go ahead (possibly after [`Allowed::delay`], for a queueing limiter).
    Allowed(Allowed),
    /// The request is over the limit now; it may succeed after [`Denied::retry_after`].
    Denied(Denied),
    /// The request's cost exceeds what the limit can ever admit at once: retrying never helps.
    InsufficientCapacity(InsufficientCapacity),
}

/// Details of an admitted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// How much cost could still be admitted right now after this request.
    pub remaining: u64,
    /// Time until the limiter is back to its full quota if nothing else arrives.
    pub reset_after: Duration,
    /// For a queueing limiter: how long to hold the request before sending it on. Zero otherwise.
    pub delay: Duration,
}

/// Details of a denied request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    /// The earliest time from now at which the same request is admitted, if nothing else arrives.
    pub retry_after: Duration,
    /// Time until the limiter is back to its full quota if nothing else arrives.
    pub reset_after: Duration,
}

/// A cost that can never fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InsufficientCapacity {
    /// The cost that was asked for.
    pub cost: u64,
    /// The largest cost the limit can admit at once.
    pub capacity: u64,
}

impl Decision {
    /// Whether the request may proceed.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed(_))
    }

    /// Remaining quota after this decision (zero unless allowed).
    #[inline]
    pub fn remaining(&self) -> u64 {
        match self {
            Decision::Allowed(a) => a.remaining,
            _ => 0,
        }
    }

    /// How long to wait before retrying; `None` when allowed or when retrying can never help.
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Decision::Denied(d) => Some(d.retry_after),
            _ => None,
        }
    }

    /// Time until the limiter is full again (zero for [`Decision::InsufficientCapacity`]).
    #[inline]
    pub fn reset_after(&self) -> Duration {
        match self {
            Decision::Allowed(a) => a.reset_after,
            Decision::Denied(d) => d.reset_after,
            Decision::InsufficientCapacity(_) => Duration::ZERO,
        }
    }

    pub(crate) fn allowed(remaining: u64, reset_after_ns: u64) -> Self {
        Decision::Allowed(Allowed {
            remaining,
            reset_after: Duration::from_nanos(reset_after_ns),
            delay: Duration::ZERO,
        })
    }

    pub(crate) fn denied(retry_after_ns: u64, reset_after_ns: u64) -> Self {
        Decision::Denied(Denied {
            retry_after: Duration::from_nanos(retry_after_ns),
            reset_after: Duration::from_nanos(reset_after_ns),
        })
    }

    pub(crate) fn insufficient(cost: u64, capacity: u64) -> Self {
        Decision::InsufficientCapacity(InsufficientCapacity { cost, capacity })
    }
}
