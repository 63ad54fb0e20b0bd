use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::rate::Rate;

/// Sliding window counter (the Cloudflare approximation): two counters per key. The count in
/// the sliding window is estimated as `previous * (1 - elapsed / window) + current`, in exact
/// integer arithmetic. Every aligned window admits at most `limit`, and the 2x burst that a
/// fixed window allows at its edges is smoothed away when traffic is even.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    rate: Rate,
}

/// State of a [`SlidingWindow`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Window number of `current`.
    pub window: u64,
    /// Cost admitted in window `window`.
    pub current: u64,
    /// Cost admitted in window `window - 1`.
    pub previous: u64,
}

impl SlidingWindow {
    /// A counter allowing about `rate.limit()` per sliding `rate.window()`.
    pub fn new(rate: Rate) -> Self {
        Self { rate }
    }

    /// Earliest elapsed time into a window whose previous window holds `previous` at which
    /// `budget` more fits: `previous * (w - e) <= budget * w`.
    fn elapsed_needed(w: u64, previous: u64, budget: u64) -> u64 {
        if previous == 0 {
            return 0;
        }
        let room = (u128::from(budget) * u128::from(w)) / u128::from(previous);
        w.saturating_sub(u64::try_from(room).unwrap_or(u64::MAX))
    }
}

impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;

    #[inline]
    fn check(
        &self,
        state: SlidingWindowState,
        now: Nanos,
        cost: u64,
    ) -> (Decision, SlidingWindowState) {
        let limit = self.rate.limit();
        if cost > limit {
            return (Decision::insufficient(cost, limit), state);
        }
        let w = self.rate.window_ns();
        let idx = now / w;
        // A clock that went backwards is treated as the start of the newest window seen.
        let (at, cur) = if idx >= state.window {
            let cur = match idx - state.window {
                0 => state,
                1 => SlidingWindowState {
                    window: idx,
                    current: 0,
                    previous: state.current,
                },
                _ => SlidingWindowState {
                    window: idx,
                    current: 0,
                    previous: 0,
                },
            };
            (now, cur)
        } else {
            (state.window.saturating_mul(w), state)
        };
        let lag = at - now;
        let window_start = cur.window.saturating_mul(w);
        let elapsed = at - window_start;
        let weighted = u128::from(cur.previous) * u128::from(w - elapsed);
        let wanted = u128::from(cur.current + cost) * u128::from(w);
        let cap = u128::from(limit) * u128::from(w);
        let reset_after =
            (window_start.saturating_add(w) - at) + if cur.current > 0 { w } else { 0 } + lag;
        if weighted + wanted > cap {
            // Time (from window_start) at which the request fits, if nothing else arrives.
            let fits_at = if cur.current + cost <= limit {
                Self::elapsed_needed(w, cur.previous, limit - cur.current - cost)
            } else {
                w + Self::elapsed_needed(w, cur.current, limit - cost)
            };
            let retry = fits_at.saturating_sub(elapsed) + lag;
            return (Decision::denied(retry, reset_after), state);
        }
        // Remaining: the largest extra cost that fits now.
        let spare = (cap - weighted - wanted) / u128::from(w);
        let remaining = u64::try_from(spare).unwrap_or(u64::MAX);
        if cost == 0 {
            return (Decision::allowed(remaining, reset_after), state);
        }
        let next = SlidingWindowState {
            current: cur.current + cost,
            ..cur
        };
        let reset_after = (window_start.saturating_add(w) - at) + w + lag;
        (Decision::allowed(remaining, reset_after), next)
    }

    fn capacity(&self) -> u64 {
        self.rate.limit()
    }

    fn refill(&self, state: SlidingWindowState, _now: Nanos, amount: u64) -> SlidingWindowState {
        SlidingWindowState {
            current: state.current.saturating_sub(amount),
            ..state
        }
    }

    fn is_idle(&self, state: &SlidingWindowState, now: Nanos) -> bool {
        let idx = now / self.rate.window_ns();
        (state.current == 0 && state.previous == 0)
            || idx >= state.window.saturating_add(2)
            || (idx == state.window + 1 && state.current == 0)
    }

    fn carry(
        &self,
        from: &Self,
        state: SlidingWindowState,
        _now: Nanos,
    ) -> Option<SlidingWindowState> {
        (self.rate.window_ns() == from.rate.window_ns()).then_some(state)
    }
}
