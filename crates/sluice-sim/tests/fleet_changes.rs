//! A fleet that changes under load: an instance that stops (as `sluice serve` stops, taking
//! itself off the fleet's list) is no longer kept a share of a key's limit by the others.

use sluice_sim::{Scenario, run};

#[test]
fn an_instance_that_leaves_is_no_longer_kept_a_share() {
    // A trickle, then a surge a window on every instance; instance 1 leaves at 180 s.
    let text = "
duration_s: 300
seed: 38
rule: { limit: 300, window_s: 60, spans: 6 }
nodes: { count: 5, leave_s: [~, 180] }
traffic:
  - steady: { rate: 0.2, prefix: surge }
  - bursts: { rate: 250, every_s: 60, length_s: 1.5, start_s: 25, prefix: surge }
store: { latency_ms: { median: 0.3, p99: 0.9 } }
policies: [predictive]
";
    let report = run(&Scenario::parse("leave.yaml", text).unwrap());
    let windows = &report.policies[0].busiest_key_admitted;
    assert_eq!(windows.len(), 5);
    // The two windows after the leave: 299 and 303 of 300. Counted as a live instance that
    // had not listed the key yet (until `LIVE_FOR` and the others' next announcement), the
    // instance that left kept a fifth of the room: 241 and 243.
    for (w, &n) in windows.iter().enumerate().skip(3) {
        assert!(
            (285..=310).contains(&n),
            "window {w} admitted {n} of 300: {windows:?}"
        );
    }
}
