//! The `rlqs` policy: Envoys enforcing the assignments of the real RLQS door's sizing hold one
//! user to the limit (neither grossly over it nor locked out), whether the user's traffic is
//! spread evenly over the Envoys or 9:1, and let most of a user under the limit through.

use sluice_sim::{Scenario, run};

fn scenario(weights: &str, rate: f64) -> Scenario {
    scenario_seeded(weights, rate, 11)
}

fn scenario_seeded(weights: &str, rate: f64, seed: u64) -> Scenario {
    let text = format!(
        "
duration_s: 300
seed: {seed}
rule: {{ limit: 100, window_s: 20 }}
nodes: {{ count: 2 }}
traffic:
  - steady: {{ rate: {rate}, weights: {weights} }}
policies: [rlqs]
"
    );
    Scenario::parse("rlqs.yaml", &text).unwrap()
}

#[test]
fn three_times_the_limit_over_two_envoys_is_held_to_it_by_demand() {
    let mut low = Vec::new();
    for weights in ["[1, 1]", "[9, 1]"] {
        for seed in 1..=12 {
            // 15 a second: three times the limit's pace of 5.
            let report = run(&scenario_seeded(weights, 15.0, seed));
            let p = &report.policies[0];
            assert_eq!(p.policy, "rlqs");
            let windows = &p.busiest_key_admitted;
            assert_eq!(windows.len(), 15);
            // After the first two windows (the first assignments are made before any usage
            // is counted), every window admits 85% to 102% of the limit and at most one window
            // under 90% over all seeds (the figure: 90% to 105%, and a p99 within 3%
            // over). Over seeds 1-12: evenly 94 to 99 of 100; 9:1, 90 to 98. Counting a
            // drained Envoy for its refill alone (its new bucket takes over the old one's
            // clock, which gives it a few tokens where the rate jumps), and sharing out a room
            // the other Envoy had spent but not yet reported: evenly up to 111, 9:1 down to 85.
            let warm = &windows[2..];
            for (w, &n) in warm.iter().enumerate() {
                assert!(
                    (85..=102).contains(&n),
                    "{weights}, seed {seed}: window {} admitted {n} of 100: {windows:?}",
                    w + 2
                );
                if n < 90 {
                    low.push((weights, seed, w + 2, n));
                }
            }
            let mean = warm.iter().sum::<u64>() as f64 / warm.len() as f64;
            assert!(
                mean >= 93.0,
                "{weights}, seed {seed}: {mean} a window: {windows:?}"
            );
            // One report per Envoy per 5 s, whatever the rate.
            assert!(
                p.store_ops_per_request < 0.05,
                "{weights}, seed {seed}: {} reports per request",
                p.store_ops_per_request
            );
        }
    }
    assert!(low.len() <= 1, "windows under 90% of the limit: {low:?}");
}

#[test]
fn a_user_under_the_limit_is_not_locked_out() {
    // Half the limit's pace over two Envoys, arriving at random: a token bucket that saves up
    // to its share of half the room takes most clumps (732 of 783 admitted; with a burst of a
    // tenth of a 5 s allowance, about 18% were refused).
    let report = run(&scenario("[1, 1]", 2.5));
    let p = &report.policies[0];
    assert!(
        p.admitted * 100 >= p.requests * 90,
        "admitted {} of {} requests under the limit",
        p.admitted,
        p.requests
    );
    assert_eq!(p.over_max_pct, 0.0);
}

#[test]
fn a_report_interval_out_of_range_or_an_empty_span_is_refused_where_it_is_written() {
    let text = "duration_s: 10\nseed: 1\nrule: { limit: 10, window_s: 10 }\nnodes: { count: 1 }\ntraffic: []\nrlqs: { report_interval_s: 0 }\n";
    let e = Scenario::parse("bad.yaml", text).unwrap_err();
    assert_eq!(e.line, 6, "{e}");
    assert!(e.message.contains("rlqs.report_interval_s"), "{e}");
    let text = text.replace("report_interval_s: 0", "unreachable: [[5, 5]]");
    let e = Scenario::parse("bad.yaml", &text).unwrap_err();
    assert_eq!(e.line, 6, "{e}");
    assert!(e.message.contains("rlqs.unreachable"), "{e}");
}

#[test]
fn two_sluice_instances_hold_a_user_to_the_limit_as_the_split_turns() {
    // `examples/scenarios/rlqs/two-instances.yaml`: two instances on one store, an Envoy on
    // each, one user at 3x the limit paced 9:1 between them, then evenly (the simulator's copy
    // of `sluice-cli/tests/rlqs_fleet.rs`, its load paced as that test's). Over seeds 1-12,
    // every window after the first two: 88 to 106 of 100, mean 96.3, one over 105 (the
    // window the split turns in), three under 90. Without the read a boundary reply of a recorded key asks for (the instance
    // whose flush landed first sized its Envoy's part on the other's count of a span before)
    // and with a tenth of the room as the parts' floor: 89 to 109, mean 101.3, 10 over 105.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios/rlqs/two-instances.yaml");
    let mut s = Scenario::load(&path).unwrap();
    let mut warm = Vec::new();
    for seed in 1..=12 {
        s.seed = seed;
        let report = run(&s);
        let windows = &report.policies[0].busiest_key_admitted;
        assert_eq!(windows.len(), 8, "seed {seed}");
        warm.extend(windows[2..].iter().map(|&n| (seed, n)));
    }
    let over: Vec<_> = warm.iter().filter(|(_, n)| *n > 105).collect();
    assert!(over.len() <= 2, "windows over 105 of 100: {over:?}");
    for &(seed, n) in &warm {
        assert!((85..=107).contains(&n), "seed {seed}: a window of {n}");
    }
    let mean = warm.iter().map(|(_, n)| *n as f64).sum::<f64>() / warm.len() as f64;
    assert!((93.0..=100.0).contains(&mean), "mean {mean}");
}

/// `store.outages` are the store unreachable to the Sluice instances, as for every policy:
/// one instance's local rule never asks it, and several keep handing out parts of what they
/// last read of each other; Envoys keep reporting. `rlqs.unreachable` is Sluice unreachable
/// to its Envoys: their reports are lost with their counts (Envoy 1.40 drops them), and what
/// they admitted meanwhile is handed out again after it.
#[test]
fn a_store_outage_is_the_stores_and_sluice_unreachable_loses_the_reports() {
    // Three Envoys at twice a limit of 300 a minute, reporting every 5 s; the fault from
    // 135 s to 165 s, in the middle of a window.
    let outage = |instances: usize, fault: Fault| {
        let (store, unreachable) = match fault {
            Fault::StoreDown => ("store: { outages: [[135, 165]] }", ""),
            Fault::SluiceUnreachable => ("", ", unreachable: [[135, 165]]"),
        };
        let text = format!(
            "
duration_s: 300
seed: 3
rule: {{ limit: 300, window_s: 60, spans: 12 }}
nodes: {{ count: 3 }}
traffic:
  - steady: {{ rate: 10 }}
{store}
rlqs: {{ instances: {instances}{unreachable} }}
policies: [rlqs]
"
        );
        let report = run(&Scenario::parse("outage.yaml", &text).unwrap());
        let p = &report.policies[0];
        (p.over_max_pct, p.store_ops)
    };
    for instances in [1, 3] {
        let (over, reports) = outage(instances, Fault::StoreDown);
        assert!(
            over <= 1.0,
            "{instances} instance(s), store down: {over}% over"
        );
        // Every Envoy reports every 5 s through the outage: three Envoys, 300 s.
        assert!(reports >= 170, "{instances} instance(s): {reports} reports");
    }
    // Sluice unreachable for 30 s: six reports of each Envoy lost, and the window over.
    let (over, reports) = outage(1, Fault::SluiceUnreachable);
    let (_, all) = outage(1, Fault::StoreDown);
    assert!(reports + 15 <= all, "{reports} reports answered of {all}");
    assert!(over > 5.0, "{over}% over with Sluice unreachable");
}

#[derive(Clone, Copy)]
enum Fault {
    StoreDown,
    SluiceUnreachable,
}
