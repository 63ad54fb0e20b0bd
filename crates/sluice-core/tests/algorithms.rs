//! Property tests for every algorithm. Failing cases are persisted under
//! `tests/algorithms.proptest-regressions` and replayed first on every run.

use proptest::prelude::*;
use sluice_core::{
    Algorithm, Decision, FixedWindow, Gcra, LeakyBucket, LeakyQueue, Nanos, Rate, SlidingLog,
    SlidingWindow, duration_to_nanos,
};
use std::time::Duration;

/// One request: how far the clock moves first (may be negative), and its cost.
#[derive(Clone, Debug)]
struct Step {
    dt: i64,
    cost: u64,
}

fn rate_strategy() -> impl Strategy<Value = Rate> {
    (1u64..=20, 1u64..=5_000).prop_map(|(limit, window_ms)| {
        Rate::new(limit, Duration::from_millis(window_ms)).expect("valid rate")
    })
}

fn steps_strategy(rate: Rate) -> impl Strategy<Value = Vec<Step>> {
    let w = rate.window_ns() as i64;
    let limit = rate.limit();
    prop::collection::vec(
        (
            prop_oneof![
                6 => 0..w / 4 + 1,
                2 => 0..2 * w,
                1 => -w..0,
                1 => Just(0i64),
            ],
            prop_oneof![6 => Just(1u64), 3 => 0..=limit, 1 => 0..=limit + 2],
        )
            .prop_map(|(dt, cost)| Step { dt, cost }),
        1..120,
    )
}

/// An admission as seen by the tests: the real time of the check and the cost admitted.
#[derive(Clone, Copy, Debug)]
struct Admission {
    now: Nanos,
    /// The newest time of any check so far (admitted or not).
    newest: Nanos,
    cost: u64,
}

/// Runs `steps` through `algorithm` from a fresh state starting at `start`, checking on every
/// step that decisions are internally consistent and that `retry_after` and `remaining` are
/// honest. Returns the admissions in order.
fn drive<A>(algorithm: &A, start: Nanos, steps: &[Step], exact_remaining: bool) -> Vec<Admission>
where
    A: Algorithm,
    A::State: Clone + std::fmt::Debug,
{
    let mut state = A::State::default();
    let mut now = start;
    let mut admitted = Vec::new();
    let mut newest = 0;
    for step in steps {
        now = now.saturating_add_signed(step.dt);
        let (decision, next) = algorithm.check(state.clone(), now, step.cost);
        // A cost that can never fit is rejected before the state sees the time.
        if step.cost <= algorithm.capacity() {
            newest = newest.max(now);
        }
        match decision {
            Decision::Allowed(a) => {
                assert!(
                    a.remaining <= algorithm.capacity(),
                    "remaining above capacity: {a:?}"
                );
                if step.cost > 0 {
                    admitted.push(Admission {
                        now,
                        newest,
                        cost: step.cost,
                    });
                }
                if exact_remaining {
                    let m = a.remaining;
                    if m > 0 {
                        let (d, _) = algorithm.check(next.clone(), now, m);
                        assert!(d.is_allowed(), "remaining {m} reported but {d:?}");
                    }
                    if m < algorithm.capacity() {
                        let (d, _) = algorithm.check(next.clone(), now, m + 1);
                        assert!(!d.is_allowed(), "remaining {m} reported but {} fits", m + 1);
                    }
                }
            }
            Decision::Denied(d) => {
                assert!(step.cost <= algorithm.capacity());
                assert!(
                    d.retry_after > Duration::ZERO,
                    "denied with zero retry_after"
                );
                let retry_at = now + duration_to_nanos(d.retry_after);
                let (again, _) = algorithm.check(state.clone(), retry_at, step.cost);
                assert!(
                    again.is_allowed(),
                    "retry at now + retry_after ({:?}) was not admitted: {again:?}; state {state:?}",
                    d.retry_after
                );
                if d.retry_after > Duration::from_nanos(1) {
                    // ...and it is the earliest time (no retry_after inflated "to be safe").
                    let (early, _) = algorithm.check(state.clone(), retry_at - 1, step.cost);
                    assert!(
                        !early.is_allowed() || now > retry_at - 1,
                        "retry_after not tight"
                    );
                }
            }
            Decision::InsufficientCapacity(i) => {
                assert!(step.cost > algorithm.capacity());
                assert_eq!(i.capacity, algorithm.capacity());
            }
            _ => unreachable!("new decision kind"),
        }
        state = next;
    }
    admitted
}

const START: Nanos = 1_700_000_000_000_000_000;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Over any span of real time `[t_i, t_j]` (even if the clock went backwards in between),
    /// GCRA admits at most `(t_j - t_i) / T + burst` units.
    #[test]
    fn gcra_never_exceeds_rate_plus_burst(
        (rate, steps, burst) in rate_strategy().prop_flat_map(|r| (Just(r), steps_strategy(r), 1..=r.limit() * 2))
    ) {
        let gcra = Gcra::with_burst(rate, burst);
        let t = gcra.emission_interval_ns() as i128;
        let admitted = drive(&gcra, START, &steps, true);
        for i in 0..admitted.len() {
            let mut sum = 0i128;
            for j in i..admitted.len() {
                sum += admitted[j].cost as i128;
                let span = admitted[j].now as i128 - admitted[i].now as i128;
                prop_assert!(sum * t <= span + burst as i128 * t,
                    "admitted {sum} units in {span} ns, T={t}, burst={burst}");
            }
        }
    }

    #[test]
    fn leaky_bucket_never_overflows(
        (rate, steps, cap) in rate_strategy().prop_flat_map(|r| (Just(r), steps_strategy(r), 1..=r.limit() * 2))
    ) {
        let meter = LeakyBucket::new(rate, cap);
        let t = rate.emission_interval_ns() as i128;
        let admitted = drive(&meter, START, &steps, true);
        // The meter drains by the newest time it has seen.
        let mut eff = 0u64;
        let eff_times: Vec<u64> = admitted.iter().map(|a| { eff = eff.max(a.now); eff }).collect();
        for i in 0..admitted.len() {
            let mut sum = 0i128;
            for j in i..admitted.len() {
                sum += admitted[j].cost as i128;
                let span = eff_times[j] as i128 - eff_times[i] as i128;
                prop_assert!(sum * t <= span + cap as i128 * t);
            }
        }
    }

    /// The queue never delays beyond `max_delay` and releases units no faster than the rate.
    #[test]
    fn leaky_queue_spaces_releases(
        (rate, steps, max_delay_ms) in rate_strategy().prop_flat_map(|r| (Just(r), steps_strategy(r), 0u64..3_000))
    ) {
        let queue = LeakyQueue::new(rate, Duration::from_millis(max_delay_ms));
        let t = queue.drain_interval_ns();
        let mut state = 0;
        let mut now = START;
        let mut last_release: Option<(u64, u64)> = None;
        for step in &steps {
            now = now.saturating_add_signed(step.dt);
            let (d, next) = queue.check(state, now, step.cost);
            if let Decision::Allowed(a) = d {
                prop_assert!(a.delay <= queue.max_delay());
                if step.cost > 0 {
                    let release = now + duration_to_nanos(a.delay);
                    if let Some((prev, prev_cost)) = last_release {
                        prop_assert!(release >= prev + prev_cost * t, "released too early");
                    }
                    last_release = Some((release, step.cost));
                }
            } else if let Decision::Denied(den) = d {
                let (again, _) = queue.check(state, now + duration_to_nanos(den.retry_after), step.cost);
                prop_assert!(again.is_allowed());
            }
            state = next;
        }
    }

    /// Each epoch-aligned window admits at most `limit`; a clock that went backwards counts
    /// against the newest window already seen.
    #[test]
    fn fixed_window_respects_each_window(
        (rate, steps) in rate_strategy().prop_flat_map(|r| (Just(r), steps_strategy(r)))
    ) {
        let fw = FixedWindow::new(rate);
        let admitted = drive(&fw, START, &steps, true);
        let w = rate.window_ns();
        let mut window = 0;
        let mut count = 0;
        for a in admitted {
            let idx = (a.now / w).max(window);
            if idx != window { window = idx; count = 0; }
            count += a.cost;
            prop_assert!(count <= rate.limit(), "window {window} admitted {count}");
        }
    }

    /// Every window `(t - W, t]` of the newest time seen holds at most `limit`.
    #[test]
    fn sliding_log_is_exact(
        (rate, steps) in rate_strategy().prop_flat_map(|r| (Just(r), steps_strategy(r)))
    ) {
        let log = SlidingLog::new(rate);
        let admitted = drive(&log, START, &steps, true);
        let w = rate.window_ns();
        let eff_times: Vec<u64> = admitted.iter().map(|a| a.newest).collect();
        for j in 0..admitted.len() {
            let sum: u64 = (0..=j)
                .filter(|&i| eff_times[i] + w > eff_times[j])
                .map(|i| admitted[i].cost)
                .sum();
            prop_assert!(sum <= rate.limit(), "{sum} admitted within one window");
        }
    }

    /// Each aligned window admits at most `limit`, and at every admission the weighted estimate
    /// `previous * (1 - elapsed) + current` stays within `limit`.
    #[test]
    fn sliding_window_respects_estimate(
        (rate, steps) in rate_strategy().prop_flat_map(|r| (Just(r), steps_strategy(r)))
    ) {
        let sw = SlidingWindow::new(rate);
        let w = rate.window_ns();
        let admitted = drive(&sw, START, &steps, true);
        let mut counts = std::collections::BTreeMap::<u64, u64>::new();
        let mut newest = 0u64;
        for a in admitted {
            newest = newest.max(a.now / w);
            let at = a.now.max(newest * w);
            let idx = at / w;
            *counts.entry(idx).or_default() += a.cost;
            let current = counts[&idx];
            let previous = counts.get(&(idx.wrapping_sub(1))).copied().unwrap_or(0);
            let elapsed = at - idx * w;
            prop_assert!(current <= rate.limit());
            prop_assert!(
                previous as u128 * (w - elapsed) as u128 + current as u128 * w as u128
                    <= rate.limit() as u128 * w as u128,
                "estimate over limit: previous {previous}, current {current}, elapsed {elapsed}"
            );
        }
    }
}

#[test]
fn cost_above_capacity_is_not_a_denial() {
    let rate = Rate::new(5, Duration::from_secs(1)).unwrap();
    let checks: Vec<Decision> = vec![
        Gcra::new(rate).check(0, START, 6).0,
        FixedWindow::new(rate).check(Default::default(), START, 6).0,
        SlidingLog::new(rate).check(Default::default(), START, 6).0,
        SlidingWindow::new(rate)
            .check(Default::default(), START, 6)
            .0,
        LeakyBucket::new(rate, 5)
            .check(Default::default(), START, 6)
            .0,
    ];
    for d in checks {
        assert!(
            matches!(d, Decision::InsufficientCapacity(i) if i.capacity == 5 && i.cost == 6),
            "{d:?}"
        );
        assert_eq!(d.retry_after(), None);
    }
}

#[test]
fn refill_returns_tokens_but_never_above_capacity() {
    let rate = Rate::new(10, Duration::from_secs(1)).unwrap();
    let gcra = Gcra::new(rate);
    let (_, s) = gcra.check(0, START, 10);
    assert!(!gcra.check(s, START, 1).0.is_allowed());
    let s = gcra.refill(s, START, 4);
    assert_eq!(gcra.check(s, START, 0).0.remaining(), 4);
    // Refilling more than was taken leaves a full bucket, not more.
    let s = gcra.refill(s, START, 100);
    assert_eq!(gcra.check(s, START, 0).0.remaining(), 10);
    let fw = FixedWindow::new(rate);
    let (_, s) = fw.check(Default::default(), START, 7);
    let s = fw.refill(s, START, 20);
    assert_eq!(fw.check(s, START, 0).0.remaining(), 10);
    let log = SlidingLog::new(rate);
    let (_, s) = log.check(Default::default(), START, 6);
    let (_, s) = log.check(s, START + 1, 3);
    let s = log.refill(s, START + 1, 5);
    assert_eq!(log.check(s, START + 1, 0).0.remaining(), 6);
}
