//! The decision a `synced` rule asks of the store for a key whose limit is too small to share
//! among the instances: on the window counters the rule's flushes add to (`<key>:<window>`),
//! so the instances that decide at the store and those that count locally and flush share one
//! count. Fixed window: the window's count plus the cost must stay within the limit. Sliding
//! window: the previous window's count weighted by the part of it still in the sliding window
//! is added, as a synced key's estimate adds it.
//!
//! Integer arithmetic on microseconds, which the memory store runs here and the Redis script
//! (`scripts::window_counter`) mirrors; both agree decision for decision (the conformance
//! suite checks it).

use std::time::Duration;

use sluice_core::{Allowed, Decision, Denied, InsufficientCapacity};

/// One window-counter decision's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WindowCounter {
    pub limit: u64,
    pub window_us: u64,
    pub sliding: bool,
}

impl WindowCounter {
    /// The window `now_us` falls in.
    pub(crate) fn window(&self, now_us: u64) -> u64 {
        now_us / self.window_us.max(1)
    }

    /// Decides `cost` at `now_us` given the window's count and the previous window's. Returns
    /// the decision and what to add to the window's count (the cost when admitted, else 0).
    pub(crate) fn decide(
        &self,
        current: u64,
        previous: u64,
        now_us: u64,
        cost: u64,
    ) -> (Decision, u64) {
        let w = u128::from(self.window_us.max(1));
        let limit = u128::from(self.limit);
        if u128::from(cost) > limit {
            let d = Decision::InsufficientCapacity(InsufficientCapacity {
                cost,
                capacity: self.limit,
            });
            return (d, 0);
        }
        let elapsed = u128::from(now_us) % w;
        let reset = w - elapsed;
        let previous = if self.sliding {
            u128::from(previous)
        } else {
            0
        };
        // Everything scaled by the window, so the weight needs no division.
        let weighted = previous * (w - elapsed);
        let wanted = (u128::from(current) + u128::from(cost)) * w;
        let cap = limit * w;
        let us = |v: u128| Duration::from_micros(u64::try_from(v).unwrap_or(u64::MAX));
        if weighted + wanted > cap {
            // Fixed window, or a count that is over on its own: the next window. Sliding,
            // with room once the previous window weighs less: when its weight leaves it.
            let current_fits = u128::from(current) + u128::from(cost) <= limit;
            let retry = if self.sliding && current_fits && previous > 0 {
                let room = limit - u128::from(current) - u128::from(cost);
                let fits_at = w - (room * w / previous).min(w);
                fits_at.saturating_sub(elapsed).max(1)
            } else {
                reset
            };
            let d = Decision::Denied(Denied {
                retry_after: us(retry),
                reset_after: us(reset),
            });
            return (d, 0);
        }
        let remaining = (cap - weighted - wanted) / w;
        let d = Decision::Allowed(Allowed {
            remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
            reset_after: us(reset),
            delay: Duration::ZERO,
        });
        (d, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXED: WindowCounter = WindowCounter {
        limit: 5,
        window_us: 1_000_000,
        sliding: false,
    };

    #[test]
    fn a_fixed_window_admits_up_to_its_limit_counting_what_others_flushed() {
        let (d, add) = FIXED.decide(3, 100, 250_000, 2);
        assert_eq!(add, 2);
        match d {
            Decision::Allowed(a) => {
                assert_eq!(a.remaining, 0);
                assert_eq!(a.reset_after, Duration::from_micros(750_000));
            }
            other => panic!("{other:?}"),
        }
        let (d, add) = FIXED.decide(5, 0, 250_000, 1);
        assert_eq!(add, 0);
        assert_eq!(
            d,
            Decision::Denied(Denied {
                retry_after: Duration::from_micros(750_000),
                reset_after: Duration::from_micros(750_000),
            })
        );
        let (d, add) = FIXED.decide(0, 0, 0, 6);
        assert_eq!(add, 0);
        assert!(matches!(d, Decision::InsufficientCapacity(_)), "{d:?}");
    }

    #[test]
    fn a_sliding_window_weighs_the_previous_window_and_says_when_it_has_room_again() {
        let sliding = WindowCounter {
            sliding: true,
            ..FIXED
        };
        // A quarter into the window, 4 of the last window weigh 3: 1 + 3 + 1 = 5 fits.
        let (d, add) = sliding.decide(1, 4, 1_250_000, 1);
        assert_eq!(add, 1);
        assert!(
            matches!(d, Decision::Allowed(a) if a.remaining == 0),
            "{d:?}"
        );
        // One more does not; the previous window weighs 2 once half the window is gone.
        let (d, add) = sliding.decide(2, 4, 1_250_000, 1);
        assert_eq!(add, 0);
        assert_eq!(
            d,
            Decision::Denied(Denied {
                retry_after: Duration::from_micros(250_000),
                reset_after: Duration::from_micros(750_000),
            })
        );
    }
}
