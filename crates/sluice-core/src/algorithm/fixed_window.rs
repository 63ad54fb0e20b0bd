use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::rate::Rate;

/// Fixed window counter: at most `limit` per window aligned to the epoch
/// (window number = `now / window`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    rate: Rate,
}

/// State of a [`FixedWindow`]: the window number and the cost counted in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Window number (`now / window`) the count belongs to.
    pub window: u64,
    /// Cost admitted in that window.
    pub count: u64,
}

impl FixedWindow {
    /// A counter allowing `rate.limit()` per `rate.window()`.
    pub fn new(rate: Rate) -> Self {
        Self { rate }
    }

    /// The rate this counter enforces.
    pub fn rate(&self) -> Rate {
        self.rate
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    #[inline]
    fn check(
        &self,
        state: FixedWindowState,
        now: Nanos,
        cost: u64,
    ) -> (Decision, FixedWindowState) {
        let limit = self.rate.limit();
        if cost > limit {
            return (Decision::insufficient(cost, limit), state);
        }
        let w = self.rate.window_ns();
        // A clock that went backwards stays in the newest window seen: it never reopens an old one.
        let (window, count) = match (now / w).cmp(&state.window) {
            std::cmp::Ordering::Greater => (now / w, 0),
            _ => (state.window, state.count),
        };
        let reset_after = (window + 1).saturating_mul(w).saturating_sub(now);
        if count.saturating_add(cost) > limit {
            return (Decision::denied(reset_after, reset_after), state);
        }
        let count = count + cost;
        let decision = Decision::allowed(limit - count, reset_after);
        if cost == 0 {
            return (decision, state);
        }
        (decision, FixedWindowState { window, count })
    }

    fn capacity(&self) -> u64 {
        self.rate.limit()
    }

    fn refill(&self, state: FixedWindowState, _now: Nanos, amount: u64) -> FixedWindowState {
        FixedWindowState {
            count: state.count.saturating_sub(amount),
            ..state
        }
    }

    fn is_idle(&self, state: &FixedWindowState, now: Nanos) -> bool {
        state.count == 0 || now / self.rate.window_ns() > state.window
    }

    fn carry(&self, from: &Self, state: FixedWindowState, _now: Nanos) -> Option<FixedWindowState> {
        (self.rate.window_ns() == from.rate.window_ns()).then_some(state)
    }
}
