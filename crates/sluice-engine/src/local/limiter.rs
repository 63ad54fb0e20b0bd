//! `local` mode: the core keyed limiter, one per rule.

use std::sync::Arc;
use std::time::Duration;

use sluice_config::{AlgorithmKind, ResolvedLimit};
use sluice_core::{
    Algorithm as _, CellFor, Clock, Cooldown, Decision, FixedWindow, Gcra, KeyedLimiter,
    LeakyBucket, LeakyQueue, Nanos, Rate, SlidingLog, SlidingWindow,
};

type SharedClock = Arc<dyn Clock>;

type Keyed<A> = KeyedLimiter<String, A, SharedClock>;

/// One rule's in-process limiter; with a `cooldown`, the same algorithm under a
/// [`Cooldown`] (a key it denies is refused for the cooldown from then, across windows).
pub(crate) enum LocalLimiter {
    Gcra(Keyed<Gcra>),
    LeakyBucket(Keyed<LeakyBucket>),
    LeakyQueue(Keyed<LeakyQueue>),
    FixedWindow(Keyed<FixedWindow>),
    SlidingWindow(Keyed<SlidingWindow>),
    SlidingLog(Keyed<SlidingLog>),
    Penalized(Penalized),
}

/// The algorithms under a cooldown.
pub(crate) enum Penalized {
    Gcra(Keyed<Cooldown<Gcra>>),
    LeakyBucket(Keyed<Cooldown<LeakyBucket>>),
    LeakyQueue(Keyed<Cooldown<LeakyQueue>>),
    FixedWindow(Keyed<Cooldown<FixedWindow>>),
    SlidingWindow(Keyed<Cooldown<SlidingWindow>>),
    SlidingLog(Keyed<Cooldown<SlidingLog>>),
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
            LocalLimiter::Penalized(Penalized::Gcra($l)) => $e,
            LocalLimiter::Penalized(Penalized::LeakyBucket($l)) => $e,
            LocalLimiter::Penalized(Penalized::LeakyQueue($l)) => $e,
            LocalLimiter::Penalized(Penalized::FixedWindow($l)) => $e,
            LocalLimiter::Penalized(Penalized::SlidingWindow($l)) => $e,
            LocalLimiter::Penalized(Penalized::SlidingLog($l)) => $e,
        }
    };
}

/// A keyed limiter of `algorithm`, under a cooldown when `cooldown` is not zero.
fn keyed<A: CellFor>(
    algorithm: A,
    cooldown: Duration,
    clock: SharedClock,
    plain: impl FnOnce(Keyed<A>) -> LocalLimiter,
    penalized: impl FnOnce(Keyed<Cooldown<A>>) -> Penalized,
) -> LocalLimiter {
    const PRESIZE: usize = 1024;
    if cooldown.is_zero() {
        plain(KeyedLimiter::with_capacity(algorithm, clock, PRESIZE))
    } else {
        let algorithm = Cooldown::new(algorithm, cooldown);
        LocalLimiter::Penalized(penalized(KeyedLimiter::with_capacity(
            algorithm, clock, PRESIZE,
        )))
    }
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
        let c = limit.cooldown;
        match limit.algorithm {
            AlgorithmKind::TokenBucket => keyed(
                Gcra::with_burst(rate, limit.burst),
                c,
                clock,
                Self::Gcra,
                Penalized::Gcra,
            ),
            AlgorithmKind::LeakyBucket => keyed(
                LeakyBucket::new(rate, limit.burst),
                c,
                clock,
                Self::LeakyBucket,
                Penalized::LeakyBucket,
            ),
            AlgorithmKind::LeakyQueue => keyed(
                LeakyQueue::new(rate, limit.max_delay),
                c,
                clock,
                Self::LeakyQueue,
                Penalized::LeakyQueue,
            ),
            AlgorithmKind::SlidingWindow => keyed(
                SlidingWindow::new(rate),
                c,
                clock,
                Self::SlidingWindow,
                Penalized::SlidingWindow,
            ),
            AlgorithmKind::SlidingWindowLog => keyed(
                SlidingLog::new(rate),
                c,
                clock,
                Self::SlidingLog,
                Penalized::SlidingLog,
            ),
            _ => keyed(
                FixedWindow::new(rate),
                c,
                clock,
                Self::FixedWindow,
                Penalized::FixedWindow,
            ),
        }
    }

    /// Takes over what each key of `old` (this rule's limiter before a reload changed its
    /// limit, burst or cooldown) has used. `None` when nothing carries: another algorithm.
    /// Keys of another window length start over (none carried).
    pub(crate) fn carry_from(&self, old: &LocalLimiter, now: Nanos) -> Option<usize> {
        use LocalLimiter as L;
        use Penalized as P;
        macro_rules! carry {
            ($($alg:ident),*) => {
                match (self, old) {
                    $(
                        (L::$alg(new), L::$alg(old)) => Some(new.carry_from(old, now, |s| {
                            new.algorithm().carry(old.algorithm(), s, now)
                        })),
                        (L::Penalized(P::$alg(new)), L::Penalized(P::$alg(old))) => {
                            Some(new.carry_from(old, now, |s| {
                                new.algorithm().carry(old.algorithm(), s, now)
                            }))
                        }
                        // A cooldown added: no block yet.
                        (L::Penalized(P::$alg(new)), L::$alg(old)) => {
                            Some(new.carry_from(old, now, |s| {
                                let inner = new.algorithm().inner().carry(old.algorithm(), s, now)?;
                                Some(sluice_core::CooldownState { inner, blocked_until: 0 })
                            }))
                        }
                        // A cooldown removed: its blocks go with it.
                        (L::$alg(new), L::Penalized(P::$alg(old))) => {
                            Some(new.carry_from(old, now, |s| {
                                new.algorithm().carry(old.algorithm().inner(), s.inner, now)
                            }))
                        }
                    )*
                    _ => None,
                }
            };
        }
        carry!(
            Gcra,
            LeakyBucket,
            LeakyQueue,
            FixedWindow,
            SlidingWindow,
            SlidingLog
        )
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
