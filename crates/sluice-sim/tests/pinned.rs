//! A client pinned to one instance whose key also trickles over the whole fleet: its bursts
//! get the room the others leave, once the reads show nobody else counts the key.

use sluice_sim::{Scenario, run};

#[test]
fn a_client_pinned_to_one_instance_gets_its_room_once_a_trickle_elsewhere_stops() {
    // One client on instance 0 sends 360 requests in a second every 20 s (limit 300 a minute);
    // the same key trickles at 0.3/s over all five instances. The early read that finds every
    // other's entry aged out (two spans without a flush) used to unsettle the key, and with
    // nothing to flush at the next boundaries no reply settled it again (windows at 82 of
    // 300); that read now settles it.
    //
    // Not met: a burst that comes after a quiet span sets its budget split evenly (the others
    // may be bursting too, and rates a span old say nothing of it: `mix/surge.yaml`), a fifth
    // of the room, and a spent budget does not read again; the next bursts of the window each
    // get a fifth of what is left. Over 20 seeds, 31 of 100 windows admitted 122-274 of 300
    // (about half the limit in most of them: 60, then 47, then 38), the others 293-306
    // (docs/ACCURACY.md, "A client pinned to one instance"). Held here as a regression
    // bound: none under 120 or over 306, at least 68 of 100 at 95% of the limit or more.
    let mut served = 0;
    for seed in 1..=20 {
        let windows = pinned_after_a_trickle(seed);
        assert_eq!(windows.len(), 5, "seed {seed}");
        for &n in &windows {
            assert!((120..=306).contains(&n), "seed {seed}: {windows:?}");
            served += usize::from(n >= 285);
        }
    }
    assert!(served >= 68, "{served} of 100 windows got 95% of the limit");
}

/// The admissions per window of a client pinned to instance 0 that bursts every 20 s while
/// its key trickles over all five instances.
fn pinned_after_a_trickle(seed: u64) -> Vec<u64> {
    let text = format!(
        "
duration_s: 300
seed: {seed}
rule: {{ limit: 300, window_s: 60, spans: 6 }}
nodes: {{ count: 5 }}
traffic:
  - steady: {{ rate: 0.3, prefix: pinned }}
  - bursts: {{ rate: 360, every_s: 20, length_s: 1, start_s: 1, weights: [1, 0, 0, 0, 0], prefix: pinned }}
store: {{ latency_ms: {{ median: 0.3, p99: 0.9 }} }}
policies: [predictive]
"
    );
    let report = run(&Scenario::parse("pinned-trickle.yaml", &text).unwrap());
    report.policies[0].busiest_key_admitted.clone()
}
