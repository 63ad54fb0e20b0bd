//! `local` mode: the core keyed limiter, one per rule.

use std::sync::Arc;

use sluice_config::{AlgorithmKind, ResolvedLimit};
use sluice_core::{
    Clock, Decision, FixedWindow, Gcra, KeyedLimiter, LeakyBucket, LeakyQueue, Nanos, Rate,
    SlidingLog, SlidingWindow,
};

type SharedClock = Arc<dyn Clock>;

/// One rule's in-process limiter.
pub(crate) enum LocalLimiter {
    Gcra(KeyedLimiter<String, Gcra, SharedClock>),
    LeakyBucket(KeyedLimiter<String, LeakyBucket, SharedClock>),
    LeakyQueue(KeyedLimiter<String, LeakyQueue, SharedClock>),
    FixedWindow(KeyedLimiter<String, FixedWindow, SharedClock>),
    SlidingWindow(KeyedLimiter<String, SlidingWindow, SharedClock>),
    SlidingLog(KeyedLimiter<String, SlidingLog, SharedClock>),
}

macro_rules! each {
    ($self:expr, $l:ident => $e:expr) => {
        match $self {
            LocalLimiter::Gcra($l) => $e,
            LocalLimiter::LeakyBucket($l) => $e,
            LocalLimiter::LeakyQueue($l) => $e,
            LocalLimiter::FixedWindow($l) => $e,
            LocalLimiter::SlidingWindow($l) => $e,
            LocalLimiter::SlidingLog($l) => $e,
        }
    };
}

/// The largest cost a rule with these settings admits at once (its bucket or its limit).
pub(crate) fn capacity_of(limit: &ResolvedLimit) -> u64 {
    use sluice_core::Algorithm as _;
    let rate = limit.rate;
    match limit.algorithm {
        AlgorithmKind::TokenBucket => Gcra::with_burst(rate, limit.burst).capacity(),
        AlgorithmKind::LeakyBucket => LeakyBucket::new(rate, limit.burst).capacity(),
        AlgorithmKind::LeakyQueue => LeakyQueue::new(rate, limit.max_delay).capacity(),
        _ => rate.limit(),
    }
}

impl LocalLimiter {
    pub(crate) fn new(limit: &ResolvedLimit, rate: Rate, clock: SharedClock) -> Self {
        const PRESIZE: usize = 1024;
        match limit.algorithm {
            AlgorithmKind::TokenBucket => Self::Gcra(KeyedLimiter::with_capacity(
                Gcra::with_burst(rate, limit.burst),
                clock,
                PRESIZE,
            )),
            AlgorithmKind::LeakyBucket => Self::LeakyBucket(KeyedLimiter::with_capacity(
                LeakyBucket::new(rate, limit.burst),
                clock,
                PRESIZE,
            )),
            AlgorithmKind::LeakyQueue => Self::LeakyQueue(KeyedLimiter::with_capacity(
                LeakyQueue::new(rate, limit.max_delay),
                clock,
                PRESIZE,
            )),
            AlgorithmKind::SlidingWindow => Self::SlidingWindow(KeyedLimiter::with_capacity(
                SlidingWindow::new(rate),
                clock,
                PRESIZE,
            )),
            AlgorithmKind::SlidingWindowLog => Self::SlidingLog(KeyedLimiter::with_capacity(
                SlidingLog::new(rate),
                clock,
                PRESIZE,
            )),
            _ => Self::FixedWindow(KeyedLimiter::with_capacity(
                FixedWindow::new(rate),
                clock,
                PRESIZE,
            )),
        }
    }

    pub(crate) fn check(&self, key: &str, now: Nanos, cost: u64) -> Decision {
        each!(self, l => l.check_at(key, now, cost))
    }

    pub(crate) fn refill(&self, key: &str, now: Nanos, amount: u64) -> bool {
        each!(self, l => l.refill_at(key, now, amount))
    }

    pub(crate) fn len(&self) -> usize {
        each!(self, l => l.len())
    }

    /// The key's state at `now` as a cost-0 check sees it, without tracking a new key.
    pub(crate) fn peek(&self, key: &str, now: Nanos) -> Option<Decision> {
        self.contains(key).then(|| self.check(key, now, 0))
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        each!(self, l => l.contains(key))
    }

    pub(crate) fn evict_idle(&self, now: Nanos) -> usize {
        each!(self, l => l.evict_idle(now))
    }
}
