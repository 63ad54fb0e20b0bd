//! A fleet that changes under load: an instance that stops (as `sluice serve` stops, taking
//! itself off the fleet's list) is no longer kept a share of a key's limit by the others; one
//! that crashes is, until its announcement ages out.

use sluice_sim::{Scenario, run};

#[test]
fn an_instance_that_leaves_is_no_longer_kept_a_share() {
    // Instance 1 leaves at 180 s.
    let windows = surge_windows("leave_s: [~, 180]");
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

#[test]
fn an_instance_that_crashes_is_kept_a_share_until_its_announcement_ages_out() {
    // The same surge; instance 1 crashes at 150 s (as `SIGKILL` stops it: no last flush, and
    // it stays on the fleet's list). The others count it as live for `LIVE_FOR` (90 s) and
    // their next announcement (every 30 s): the window after the crash admits about four
    // fifths of the limit (the crashed instance's fifth of the room kept for it), and the
    // fleet gets the whole limit again once it is off the list.
    let windows = surge_windows("crash_s: [~, 150]");
    // Measured: 349, 300, 296, 242, 302.
    assert!((225..=260).contains(&windows[3]), "{windows:?}");
    assert!((285..=310).contains(&windows[4]), "{windows:?}");
}

/// The admissions per window of a user trickling at 0.2/s, then surging once a window on every
/// one of five instances, whose `nodes` also say `change` (who leaves or crashes when).
fn surge_windows(change: &str) -> Vec<u64> {
    let text = format!(
        "
duration_s: 300
seed: 38
rule: {{ limit: 300, window_s: 60, spans: 6 }}
nodes: {{ count: 5, {change} }}
traffic:
  - steady: {{ rate: 0.2, prefix: surge }}
  - bursts: {{ rate: 250, every_s: 60, length_s: 1.5, start_s: 25, prefix: surge }}
store: {{ latency_ms: {{ median: 0.3, p99: 0.9 }} }}
policies: [predictive]
"
    );
    let report = run(&Scenario::parse("fleet-change.yaml", &text).unwrap());
    let windows = report.policies[0].busiest_key_admitted.clone();
    assert_eq!(windows.len(), 5);
    windows
}
