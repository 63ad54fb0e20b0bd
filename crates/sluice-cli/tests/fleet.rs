//! A new key's first window on a fleet of real processes: three `sluice serve` on one real
//! Redis, one user's requests spread evenly over them at 2.4x the limit, 3 spans. The
//! traffic is the simulator's own (`examples/scenarios/first-window/three.yaml`, cut to two
//! windows), replayed in real time; the simulator runs the same requests and must agree. And
//! per-user limits too small to share (20 per 10 s, 5 spans, new users at 2-5x): decided at
//! the store, every user's window gets exactly the limit.

#[path = "common/fleet.rs"]
mod fleet;

use std::path::Path;
use std::time::Duration;

/// Runs `examples/scenarios/first-window/<name>` (cut to `seconds`, predictive) on three real
/// instances that have announced themselves (so they know the fleet's size), and in the
/// simulator. Returns the scenario, what the real processes admitted, the simulator's report
/// and the fleet (for its logs).
async fn on_real_fleet(
    name: &str,
    seconds: u64,
) -> (
    sluice_sim::Scenario,
    fleet::Replayed,
    sluice_sim::Report,
    fleet::Fleet,
) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios/first-window")
        .join(name);
    let mut scenario = sluice_sim::Scenario::load(&file).unwrap();
    scenario.duration_s = seconds;
    scenario.policies = Some(vec!["predictive".to_owned()]);
    let requests = sluice_sim::requests(&scenario);
    let fleet = fleet::Fleet::start(
        Path::new(env!("CARGO_BIN_EXE_sluice")),
        3,
        &sluice_sim::rule_file("predictive", &scenario),
        "",
    );
    fleet.wait_until_all_known();
    let window = Duration::from_secs(scenario.rule.window_s);
    let real = fleet::replay(&fleet.http_ports(), &requests, window).await;
    let sim = sluice_sim::run(&scenario);
    (scenario, real, sim, fleet)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_hold_a_new_keys_first_window_and_agree_with_the_simulator() {
    let (_, real, sim, fleet) = on_real_fleet("three.yaml", 12).await;
    let admitted = real.admitted_by_window(2);
    let simulated = &sim.policies[0].admitted_by_window;
    eprintln!(
        "3 instances, 300 per 6 s, 3 spans, 2.4x: admitted per window {admitted:?}, simulated {simulated:?} ({} late, {} failed)",
        real.late, real.failed
    );
    assert_eq!(real.failed, 0, "{}", fleet.logs());
    for (w, &n) in admitted.iter().enumerate() {
        // Within 5% of the limit, the first window included (it used to admit 400: +33%);
        // and not far under it (the load is 2.4x).
        assert!(
            (255..=315).contains(&n),
            "window {w}: {n} admitted of 300 ({} requests sent late); the instances logged:\n{}",
            real.late,
            fleet.logs()
        );
        // The simulator agrees with the real processes within a few percent.
        let s = simulated[w];
        assert!(n.abs_diff(s) <= 15, "window {w}: real {n}, simulated {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_limits_too_small_to_share_are_held_exactly_by_real_processes() {
    // 20 per 10 s with 5 spans over three instances: decided at the store. New users every
    // second at 2x and 5x (`first-window/churn-3.yaml`, cut to 20 s), each spread evenly.
    // Only once the instances know the fleet's size is the limit small for them.
    let (scenario, real, sim, fleet) = on_real_fleet("churn-3.yaml", 20).await;
    assert_eq!(real.failed, 0, "{}", fleet.logs());
    let limit = scenario.rule.limit;
    // The store's own count of every key and window (the instances' windows, by their
    // clocks): never over the limit.
    let keys = fleet.redis.command("KEYS sluice:v1:*");
    let counters: Vec<&str> = keys
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .filter(|k| !k.ends_with(":n") && !k.contains(":r:") && !k.ends_with("fleet"))
        .collect();
    assert!(counters.len() >= 20, "{keys}");
    for k in counters {
        let value = fleet.redis.command(&format!("GET {k}"));
        let count: u64 = value
            .lines()
            .find(|l| !l.starts_with('$'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!(count <= limit, "{k}: {count} of {limit}");
    }
    // The replay counts a request in the window it was sent in; one sent just before a
    // boundary may be decided just after it, so a key-window seen from the client may hold
    // one request of the next.
    let over: Vec<_> = real
        .counts
        .iter()
        .filter(|(_, c)| c.admitted > limit + 1)
        .collect();
    assert!(
        over.is_empty(),
        "key-windows over {limit}: {over:?} ({} requests sent late); the instances logged:\n{}",
        real.late,
        fleet.logs()
    );
    // Every key-window with more demand than the limit got the whole limit (give or take
    // the request at a boundary), and the simulator admits the same in all.
    let admitted: u64 = real.counts.values().map(|c| c.admitted).sum();
    let full = real
        .counts
        .values()
        .filter(|c| c.offered > limit)
        .all(|c| c.admitted.abs_diff(limit) <= 1);
    let simulated = sim.policies[0].admitted;
    eprintln!(
        "churn over 3 instances, 20 per 10 s: admitted {admitted} (simulated {simulated}), {} key-windows, {} late",
        real.counts.len(),
        real.late
    );
    assert!(full, "a key-window with room refused: {:?}", real.counts);
    assert!(
        admitted.abs_diff(simulated) <= admitted / 20,
        "real {admitted}, simulated {simulated}"
    );
}
