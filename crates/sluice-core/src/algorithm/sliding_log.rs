use std::collections::VecDeque;

use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::rate::Rate;

/// Sliding window log: exact; at most `limit` in every window `(t - window, t]`.
/// Memory is O(limit) per key (one entry per distinct admission time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingLog {
    rate: Rate,
}

/// State of a [`SlidingLog`]: admissions still inside the window, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLogState {
    entries: VecDeque<(Nanos, u64)>,
    total: u64,
    /// The newest time any check has seen: expiry never runs ahead of it and comes back.
    newest: Nanos,
}

impl SlidingLogState {
    /// The admissions (time, cost) still remembered, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (Nanos, u64)> + '_ {
        self.entries.iter().copied()
    }
}

impl SlidingLog {
    /// A log allowing `rate.limit()` in any window of `rate.window()`.
    pub fn new(rate: Rate) -> Self {
        Self { rate }
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    fn check(
        &self,
        mut state: SlidingLogState,
        now: Nanos,
        cost: u64,
    ) -> (Decision, SlidingLogState) {
        let limit = self.rate.limit();
        if cost > limit {
            return (Decision::insufficient(cost, limit), state);
        }
        let w = self.rate.window_ns();
        // Never admit before the newest admission: a clock that went backwards cannot reopen room.
        let at = state.newest.max(now);
        state.newest = at;
        let lag = at - now;
        while let Some(&(t, c)) = state.entries.front() {
            if t.saturating_add(w) > at {
                break;
            }
            state.entries.pop_front();
            state.total -= c;
        }
        let reset_after = state
            .entries
            .back()
            .map_or(0, |&(t, _)| t.saturating_add(w) - at)
            + lag;
        if state.total + cost > limit {
            let mut to_free = state.total + cost - limit;
            let mut retry = reset_after;
            for &(t, c) in &state.entries {
                if c >= to_free {
                    retry = t.saturating_add(w) - at + lag;
                    break;
                }
                to_free -= c;
            }
            return (Decision::denied(retry, reset_after), state);
        }
        if cost == 0 {
            return (Decision::allowed(limit - state.total, reset_after), state);
        }
        state.total += cost;
        match state.entries.back_mut() {
            Some((t, c)) if *t == at => *c += cost,
            _ => state.entries.push_back((at, cost)),
        }
        let remaining = limit - state.total;
        (Decision::allowed(remaining, w + lag), state)
    }

    fn capacity(&self) -> u64 {
        self.rate.limit()
    }

    fn refill(&self, mut state: SlidingLogState, _now: Nanos, mut amount: u64) -> SlidingLogState {
        // Give back the newest admissions first: they would have expired last.
        while amount > 0 {
            let Some((_, cost)) = state.entries.back_mut() else {
                break;
            };
            let take = amount.min(*cost);
            *cost -= take;
            state.total -= take;
            amount -= take;
            if *cost == 0 {
                state.entries.pop_back();
            }
        }
        state
    }

    fn is_idle(&self, state: &SlidingLogState, now: Nanos) -> bool {
        state
            .entries
            .back()
            .is_none_or(|&(t, _)| t.saturating_add(self.rate.window_ns()) <= now)
    }

    fn carry(&self, from: &Self, state: SlidingLogState, _now: Nanos) -> Option<SlidingLogState> {
        (self.rate.window_ns() == from.rate.window_ns()).then_some(state)
    }
}
