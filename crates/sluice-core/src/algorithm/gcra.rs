use crate::algorithm::{Algorithm, mul_ns};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::rate::Rate;

/// Token bucket as GCRA (generic cell rate algorithm): one timestamp per key.
///
/// The state is the theoretical arrival time (TAT): when the bucket would be full again.
/// `burst` is the bucket size (defaults to the rate's limit). Over any interval of length `L`
/// the admitted cost `c` satisfies `c * T < L + burst * T`, where `T` is the emission interval.
///
/// ```
/// use sluice_core::{Algorithm, Gcra, Rate};
/// use std::num::NonZeroU64;
///
/// let gcra = Gcra::new(Rate::per_second(NonZeroU64::new(2).unwrap()));
/// let (d1, s) = gcra.check(0, 0, 1);
/// let (d2, s) = gcra.check(s, 0, 1);
/// let (d3, _) = gcra.check(s, 0, 1);
/// assert!(d1.is_allowed() && d2.is_allowed());
/// assert_eq!(d3.retry_after().unwrap().as_millis(), 500);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gcra {
    emission_ns: u64,
    burst: u64,
    tolerance_ns: u64,
}

impl Gcra {
    /// A bucket of `rate.limit()` tokens refilled at `rate`.
    pub fn new(rate: Rate) -> Self {
        Self::with_burst(rate, rate.limit())
    }

    /// A bucket of `burst` tokens (at least 1) refilled at `rate`.
    pub fn with_burst(rate: Rate, burst: u64) -> Self {
        let burst = burst.max(1);
        let emission_ns = rate.emission_interval_ns();
        Self {
            emission_ns,
            burst,
            tolerance_ns: mul_ns(burst, emission_ns),
        }
    }

    /// Time between two tokens.
    pub fn emission_interval_ns(&self) -> u64 {
        self.emission_ns
    }
}

impl Algorithm for Gcra {
    type State = Nanos;

    #[inline]
    fn check(&self, tat: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
        if cost > self.burst {
            return (Decision::insufficient(cost, self.burst), tat);
        }
        let start = tat.max(now);
        let new_tat = start.saturating_add(mul_ns(cost, self.emission_ns));
        let allow_at = new_tat.saturating_sub(self.tolerance_ns);
        if now < allow_at {
            return (Decision::denied(allow_at - now, start - now), tat);
        }
        let headroom = now.saturating_add(self.tolerance_ns) - new_tat;
        let remaining = headroom / self.emission_ns;
        if cost == 0 {
            return (Decision::allowed(remaining, start - now), tat);
        }
        (Decision::allowed(remaining, new_tat - now), new_tat)
    }

    fn capacity(&self) -> u64 {
        self.burst
    }

    fn refill(&self, tat: Nanos, now: Nanos, amount: u64) -> Nanos {
        // A TAT at or before `now` is a full bucket; never go below it.
        tat.saturating_sub(mul_ns(amount, self.emission_ns))
            .max(now.min(tat))
    }

    fn is_idle(&self, tat: &Nanos, now: Nanos) -> bool {
        *tat <= now
    }

    fn carry(&self, from: &Self, tat: Nanos, now: Nanos) -> Option<Nanos> {
        Some(crate::algorithm::rescale(
            tat,
            now,
            from.emission_ns,
            self.emission_ns,
        ))
    }
}
