//! `exact` mode's circuit breaker: after the store fails several calls in a row (timeouts,
//! refused connections), requests stop waiting on it: the rule's `on_store_error` decides them
//! at once for a cool-off, then one request probes the store, and a probe that succeeds
//! closes the breaker.

use metrics::{counter, gauge};
use parking_lot::Mutex;
use sluice_config::ExactCalls;
use sluice_core::Nanos;

/// Where the breaker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests call the store.
    Closed,
    /// Requests do not call the store; `on_store_error` decides them.
    Open,
    /// One request is probing the store; the others do not call it.
    HalfOpen,
}

impl BreakerState {
    /// `closed`, `open` or `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The `sluice_exact_breaker_state` gauge's value: 0 closed, 1 open, 2 half-open.
    fn gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::Open => 1.0,
            BreakerState::HalfOpen => 2.0,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum State {
    /// Counting the calls that failed in a row.
    Closed { failures: u32 },
    /// Failing fast until `until`.
    Open { until: Nanos },
    /// A probe started at `since`; if it never reports (its request was cancelled), another
    /// may start one cool-off later.
    HalfOpen { since: Nanos },
}

/// What a request does about the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Call it.
    Call,
    /// Call it as the breaker's probe.
    Probe,
    /// Do not call it: `on_store_error` decides.
    FailFast,
}

/// The breaker (see the module documentation); one per store.
pub(crate) struct Breaker {
    state: Mutex<State>,
    failures_to_open: u32,
    cool_off_ns: u64,
}

impl Breaker {
    pub(crate) fn new(calls: &ExactCalls) -> Self {
        Self {
            state: Mutex::new(State::Closed { failures: 0 }),
            failures_to_open: calls.breaker_failures.max(1),
            cool_off_ns: sluice_core::duration_to_nanos(calls.breaker_cool_off),
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        match *self.state.lock() {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether a request at `now` may call the store.
    pub(crate) fn admit(&self, now: Nanos) -> Admission {
        let mut state = self.state.lock();
        match *state {
            State::Closed { .. } => Admission::Call,
            State::Open { until } | State::HalfOpen { since: until } if now < until => {
                counter!("sluice_exact_breaker_fast_failures_total").increment(1);
                Admission::FailFast
            }
            State::Open { .. } | State::HalfOpen { .. } => {
                *state = State::HalfOpen {
                    since: now.saturating_add(self.cool_off_ns),
                };
                report(BreakerState::HalfOpen);
                Admission::Probe
            }
        }
    }

    /// A store call answered.
    pub(crate) fn succeeded(&self) {
        let mut state = self.state.lock();
        if !matches!(*state, State::Closed { failures: 0 }) {
            if !matches!(*state, State::Closed { .. }) {
                tracing::info!("exact mode's store answers again: breaker closed");
                report(BreakerState::Closed);
            }
            *state = State::Closed { failures: 0 };
        }
    }

    /// A store call failed as a whole (timed out, or the store could not be reached) at `now`.
    pub(crate) fn failed(&self, now: Nanos) {
        let mut state = self.state.lock();
        let open = match *state {
            State::Closed { failures } if failures + 1 >= self.failures_to_open => true,
            State::Closed { failures } => {
                *state = State::Closed {
                    failures: failures + 1,
                };
                false
            }
            State::HalfOpen { .. } => true,
            // A call admitted before the breaker opened.
            State::Open { .. } => false,
        };
        if open {
            *state = State::Open {
                until: now.saturating_add(self.cool_off_ns),
            };
            tracing::warn!(
                cool_off_ms = self.cool_off_ns / 1_000_000,
                "exact mode's store keeps failing: breaker open, on_store_error decides until a probe succeeds"
            );
            report(BreakerState::Open);
        }
    }
}

fn report(state: BreakerState) {
    gauge!("sluice_exact_breaker_state").set(state.gauge());
    if state == BreakerState::Open {
        counter!("sluice_exact_breaker_opened_total").increment(1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: u64 = 1_000_000;

    fn breaker() -> Breaker {
        Breaker::new(&ExactCalls {
            breaker_failures: 3,
            breaker_cool_off: Duration::from_millis(100),
            ..ExactCalls::default()
        })
    }

    #[test]
    fn opens_after_failures_in_a_row_and_a_success_resets_the_count() {
        let b = breaker();
        b.failed(0);
        b.failed(0);
        b.succeeded();
        b.failed(0);
        b.failed(0);
        assert_eq!(b.state(), BreakerState::Closed);
        b.failed(0);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.admit(50 * MS), Admission::FailFast);
    }

    #[test]
    fn after_the_cool_off_one_probe_goes_and_its_outcome_decides() {
        let b = breaker();
        (0..3).for_each(|_| b.failed(0));
        assert_eq!(b.admit(100 * MS), Admission::Probe);
        assert_eq!(
            b.admit(101 * MS),
            Admission::FailFast,
            "one probe at a time"
        );
        b.failed(120 * MS);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.admit(200 * MS), Admission::FailFast);
        assert_eq!(b.admit(220 * MS), Admission::Probe);
        b.succeeded();
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.admit(221 * MS), Admission::Call);
    }

    #[test]
    fn a_probe_that_never_reports_does_not_keep_the_breaker_half_open() {
        let b = breaker();
        (0..3).for_each(|_| b.failed(0));
        assert_eq!(b.admit(100 * MS), Admission::Probe);
        // Its request was cancelled: one cool-off later another request probes.
        assert_eq!(b.admit(150 * MS), Admission::FailFast);
        assert_eq!(b.admit(200 * MS), Admission::Probe);
    }
}
