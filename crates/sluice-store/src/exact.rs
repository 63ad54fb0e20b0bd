//! `exact` mode: one atomic decision in the store per request, mirroring `sluice-core`'s math.
//!
//! Times are whole microseconds since the epoch: Lua numbers are doubles, exact only up to 2^53,
//! and nanoseconds since 1970 are beyond that. Both the memory store and the Redis scripts run
//! the same integer arithmetic on microseconds, so they agree decision for decision.

use std::sync::Arc;
use std::time::Duration;

use crate::window_counter::WindowCounter;
use sluice_core::{
    Algorithm, Allowed, Decision, Denied, FixedWindow, FixedWindowState, Gcra, Rate, SlidingLog,
    SlidingLogState, SlidingWindow, SlidingWindowState,
};

/// The algorithm of an `exact` rule, with its parameters in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExactAlgorithm {
    /// Fixed window counter.
    FixedWindow {
        /// Limit per window.
        limit: u64,
        /// Window, µs.
        window_us: u64,
    },
    /// Token bucket (GCRA).
    TokenBucket {
        /// Limit per window.
        limit: u64,
        /// Window, µs.
        window_us: u64,
        /// Bucket size.
        burst: u64,
    },
    /// Sliding window counter.
    SlidingWindow {
        /// Limit per window.
        limit: u64,
        /// Window, µs.
        window_us: u64,
    },
    /// Sliding window log (a sorted set in Redis).
    SlidingLog {
        /// Limit per window.
        limit: u64,
        /// Window, µs.
        window_us: u64,
    },
    /// A `synced` rule's window counter (`<key>:<window>`, which its flushes add to), for a
    /// key whose limit is too small to share among the instances: admitted while the window's
    /// count (with `sliding`, plus the previous window's weighted count) leaves room for the
    /// cost. The counter lives two windows, as a flush's does.
    WindowCounter {
        /// Limit per window.
        limit: u64,
        /// Window, µs.
        window_us: u64,
        /// Weigh the previous window's count in (sliding window counter).
        sliding: bool,
    },
}

impl ExactAlgorithm {
    pub(crate) fn window_us(&self) -> u64 {
        match *self {
            ExactAlgorithm::FixedWindow { window_us, .. }
            | ExactAlgorithm::TokenBucket { window_us, .. }
            | ExactAlgorithm::SlidingWindow { window_us, .. }
            | ExactAlgorithm::SlidingLog { window_us, .. }
            | ExactAlgorithm::WindowCounter { window_us, .. } => window_us,
        }
    }

    /// The limit per window.
    pub fn limit(&self) -> u64 {
        match *self {
            ExactAlgorithm::FixedWindow { limit, .. }
            | ExactAlgorithm::TokenBucket { limit, .. }
            | ExactAlgorithm::SlidingWindow { limit, .. }
            | ExactAlgorithm::SlidingLog { limit, .. }
            | ExactAlgorithm::WindowCounter { limit, .. } => limit,
        }
    }

    /// The window-counter decision, for [`ExactAlgorithm::WindowCounter`].
    pub(crate) fn window_counter(&self) -> Option<WindowCounter> {
        match *self {
            ExactAlgorithm::WindowCounter {
                limit,
                window_us,
                sliding,
            } if window_us > 0 => Some(WindowCounter {
                limit,
                window_us,
                sliding,
            }),
            _ => None,
        }
    }

    fn rate(limit: u64, window_us: u64) -> Option<Rate> {
        // The core works in abstract time units; here one unit is a microsecond.
        Rate::new(limit, Duration::from_nanos(window_us)).ok()
    }
}

/// One `exact` decision to take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExactRequest {
    /// The counter's base key (see [`crate::CounterKey`]).
    pub key: Arc<str>,
    /// Algorithm and parameters.
    pub algorithm: ExactAlgorithm,
    /// Store-corrected time, µs since the epoch.
    pub now_us: u64,
    /// Cost of the request.
    pub cost: u64,
}

/// State of one exact key in the memory store.
#[derive(Clone, Debug)]
pub(crate) enum ExactState {
    Gcra(u64),
    Fixed(FixedWindowState),
    Sliding(SlidingWindowState),
    Log(SlidingLogState),
}

/// Converts a decision computed in microsecond units into real durations.
fn from_us(decision: Decision) -> Decision {
    let us = |d: Duration| Duration::from_micros(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    match decision {
        Decision::Allowed(a) => Decision::Allowed(Allowed {
            remaining: a.remaining,
            reset_after: us(a.reset_after),
            delay: us(a.delay),
        }),
        Decision::Denied(d) => Decision::Denied(Denied {
            retry_after: us(d.retry_after),
            reset_after: us(d.reset_after),
        }),
        other => other,
    }
}

/// Runs `request` against `state` with the core algorithms: the reference the Redis scripts
/// mirror. Returns the decision and the new state. A state of the wrong kind (the rule's
/// algorithm changed) starts over. `None` for invalid parameters, and for
/// [`ExactAlgorithm::WindowCounter`], which decides on the window counters (the memory store
/// keeps them with its flushed counts).
pub fn decide_in_memory(
    request: &ExactRequest,
    state: Option<ExactStateHandle>,
) -> Option<(Decision, ExactStateHandle)> {
    let state = state.map(|s| s.0);
    let (d, s) = match request.algorithm {
        ExactAlgorithm::FixedWindow { limit, window_us } => {
            let alg = FixedWindow::new(ExactAlgorithm::rate(limit, window_us)?);
            let prev = match state {
                Some(ExactState::Fixed(s)) => s,
                _ => Default::default(),
            };
            let (d, s) = alg.check(prev, request.now_us, request.cost);
            (d, ExactState::Fixed(s))
        }
        ExactAlgorithm::TokenBucket {
            limit,
            window_us,
            burst,
        } => {
            let alg = Gcra::with_burst(ExactAlgorithm::rate(limit, window_us)?, burst);
            let prev = match state {
                Some(ExactState::Gcra(s)) => s,
                _ => 0,
            };
            let (d, s) = alg.check(prev, request.now_us, request.cost);
            (d, ExactState::Gcra(s))
        }
        ExactAlgorithm::SlidingWindow { limit, window_us } => {
            let alg = SlidingWindow::new(ExactAlgorithm::rate(limit, window_us)?);
            let prev = match state {
                Some(ExactState::Sliding(s)) => s,
                _ => Default::default(),
            };
            let (d, s) = alg.check(prev, request.now_us, request.cost);
            (d, ExactState::Sliding(s))
        }
        ExactAlgorithm::SlidingLog { limit, window_us } => {
            let alg = SlidingLog::new(ExactAlgorithm::rate(limit, window_us)?);
            let prev = match state {
                Some(ExactState::Log(s)) => s,
                _ => Default::default(),
            };
            let (d, s) = alg.check(prev, request.now_us, request.cost);
            (d, ExactState::Log(s))
        }
        ExactAlgorithm::WindowCounter { .. } => return None,
    };
    Some((from_us(d), ExactStateHandle(s)))
}

/// Opaque state of one exact key, as kept by [`decide_in_memory`]'s callers.
#[derive(Clone, Debug)]
pub struct ExactStateHandle(pub(crate) ExactState);
