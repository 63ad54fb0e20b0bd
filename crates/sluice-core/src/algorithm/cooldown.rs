use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::decision::{Decision, Denied};

/// A penalty on top of any algorithm: a key the inner algorithm denies is refused for
/// `cooldown` from that denial, whatever room the inner algorithm regains meanwhile (a
/// cooldown longer than the window blocks across windows). A request refused during the
/// block is not counted and does not extend it; the block ends `cooldown` after the denial
/// that started it.
///
/// ```
/// use sluice_core::{Algorithm, Cooldown, FixedWindow, Rate};
/// use std::num::NonZeroU64;
/// use std::time::Duration;
///
/// // 2 per second, and a key that asks for more is refused for 3 seconds.
/// let rate = Rate::per_second(NonZeroU64::new(2).unwrap());
/// let limiter = Cooldown::new(FixedWindow::new(rate), Duration::from_secs(3));
/// let s = Default::default();
/// let (_, s) = limiter.check(s, 0, 2);
/// let (denied, s) = limiter.check(s, 100_000_000, 1);
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(3)));
/// // The next window has room, but the key is still blocked.
/// let (d, _) = limiter.check(s, 1_500_000_000, 1);
/// assert!(!d.is_allowed());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cooldown<A> {
    inner: A,
    cooldown_ns: u64,
}

/// State of a [`Cooldown`]: the inner algorithm's, and until when the key is blocked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CooldownState<S> {
    /// The inner algorithm's state.
    pub inner: S,
    /// The key is refused before this time (0: not blocked).
    pub blocked_until: Nanos,
}

impl<A: Algorithm> Cooldown<A> {
    /// `inner`, with a block of `cooldown` after each of its denials.
    pub fn new(inner: A, cooldown: Duration) -> Self {
        Self {
            inner,
            cooldown_ns: crate::clock::duration_to_nanos(cooldown),
        }
    }

    /// The algorithm under the penalty.
    pub fn inner(&self) -> &A {
        &self.inner
    }
}

impl<A: Algorithm> Algorithm for Cooldown<A> {
    type State = CooldownState<A::State>;

    #[inline]
    fn check(&self, state: Self::State, now: Nanos, cost: u64) -> (Decision, Self::State) {
        if now < state.blocked_until {
            let wait = state.blocked_until - now;
            if cost == 0 {
                // A query: nothing left until the block ends.
                return (Decision::allowed(0, wait), state);
            }
            if cost > self.inner.capacity() {
                return (Decision::insufficient(cost, self.inner.capacity()), state);
            }
            return (Decision::denied(wait, wait), state);
        }
        let (decision, inner) = self.inner.check(state.inner, now, cost);
        let blocked_until = match decision {
            Decision::Denied(_) if cost > 0 && self.cooldown_ns > 0 => {
                now.saturating_add(self.cooldown_ns)
            }
            _ => state.blocked_until,
        };
        let decision = match decision {
            Decision::Denied(d) if blocked_until > now => {
                let wait = Duration::from_nanos(blocked_until - now);
                Decision::Denied(Denied {
                    retry_after: d.retry_after.max(wait),
                    reset_after: d.reset_after.max(wait),
                })
            }
            other => other,
        };
        (
            decision,
            CooldownState {
                inner,
                blocked_until,
            },
        )
    }

    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    fn refill(&self, state: Self::State, now: Nanos, amount: u64) -> Self::State {
        // Tokens given back do not lift a penalty.
        CooldownState {
            inner: self.inner.refill(state.inner, now, amount),
            blocked_until: state.blocked_until,
        }
    }

    fn is_idle(&self, state: &Self::State, now: Nanos) -> bool {
        now >= state.blocked_until && self.inner.is_idle(&state.inner, now)
    }

    fn carry(&self, from: &Self, state: Self::State, now: Nanos) -> Option<Self::State> {
        // A block already earned stays, whatever the new cooldown.
        Some(CooldownState {
            inner: self.inner.carry(&from.inner, state.inner, now)?,
            blocked_until: state.blocked_until,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;
    use crate::{FixedWindow, Gcra, Rate};

    const SEC: u64 = 1_000_000_000;

    fn per_second(n: u64) -> Rate {
        Rate::per_second(NonZeroU64::new(n).unwrap())
    }

    #[test]
    fn a_denial_blocks_across_windows_for_the_cooldown_and_then_lifts() {
        let c = Cooldown::new(FixedWindow::new(per_second(3)), Duration::from_secs(6));
        let mut s = CooldownState::default();
        for _ in 0..3 {
            let (d, next) = c.check(s, 0, 1);
            assert!(d.is_allowed());
            s = next;
        }
        let (d, next) = c.check(s, SEC / 2, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(6)));
        s = next;
        // Every later window has room; the block holds until 6.5 s and does not grow.
        for t in 1..6 {
            let (d, next) = c.check(s, t * SEC, 1);
            assert!(!d.is_allowed(), "admitted at {t} s during the cooldown");
            s = next;
        }
        let (d, _) = c.check(s, 6 * SEC + SEC / 2, 1);
        assert!(d.is_allowed(), "still blocked after the cooldown");
    }

    #[test]
    fn a_query_during_the_block_counts_nothing_and_reports_no_room() {
        let c = Cooldown::new(Gcra::new(per_second(1)), Duration::from_secs(10));
        let (_, s) = c.check(CooldownState::default(), 0, 1);
        let (_, s) = c.check(s, 0, 1);
        assert_eq!(s.blocked_until, 10 * SEC);
        let (d, after) = c.check(s, 5 * SEC, 0);
        assert_eq!(d.remaining(), 0);
        assert!(d.is_allowed());
        assert_eq!(after, s);
        assert!(!c.is_idle(&s, 5 * SEC));
        assert!(c.is_idle(&s, 11 * SEC));
    }

    #[test]
    fn a_refill_does_not_lift_the_block() {
        let c = Cooldown::new(FixedWindow::new(per_second(1)), Duration::from_secs(4));
        let (_, s) = c.check(CooldownState::default(), 0, 1);
        let (_, s) = c.check(s, 0, 1);
        let s = c.refill(s, 0, 1);
        assert!(!c.check(s, SEC / 10, 1).0.is_allowed());
    }

    #[test]
    fn a_cost_beyond_the_capacity_is_insufficient_even_when_blocked() {
        let c = Cooldown::new(FixedWindow::new(per_second(2)), Duration::from_secs(4));
        let (_, s) = c.check(CooldownState::default(), 0, 2);
        let (_, s) = c.check(s, 0, 1);
        assert!(matches!(
            c.check(s, 1, 5).0,
            Decision::InsufficientCapacity(_)
        ));
    }
}

#[cfg(test)]
mod size {
    use crate::cell::LockedCell;
    use crate::{CooldownState, FixedWindowState};

    // docs/BENCHMARKS.md: the cells of keys under a cooldown.
    const _: () = assert!(std::mem::size_of::<LockedCell<CooldownState<u64>>>() == 24);
    const _: () = assert!(std::mem::size_of::<LockedCell<CooldownState<FixedWindowState>>>() == 32);
}
