//! A mix of users on five real `sluice serve` instances and one real Redis, judged class by
//! class (`examples/scenarios/mix/short.yaml`, three windows of 12 s): a heavy user routed
//! unevenly, a bursty one, users far under their limit, a churn of short-lived users, a client
//! pinned to one instance, a user whose traffic moves to another instance mid-window, a tenant
//! whose many users' requests also count against its own key (a second descriptor). The
//! simulator runs the same requests and must agree with the real processes class by class.
//! The full mix, one minute windows for five minutes, is `scripts/mixed-traffic.sh`
//! (docs/ACCURACY.md, "A mix of users"). And the same mix on a fleet that changes under load:
//! an instance joins, one leaves, one crashes (`mix/short-changing.yaml`).

#[path = "common/fleet.rs"]
mod fleet;

use std::path::Path;
use std::time::Duration;

use sluice_sim::classes::ClassReport;

fn class<'a>(classes: &'a [ClassReport], name: &str) -> &'a ClassReport {
    classes
        .iter()
        .find(|c| c.class == name)
        .unwrap_or_else(|| panic!("no class {name} in {classes:?}"))
}

/// The figures per class of the real run and of the simulator on the same scenario (printed).
fn real_and_simulated(
    replayed: &fleet::Replayed,
    scenario: &sluice_sim::Scenario,
) -> (Vec<ClassReport>, Vec<ClassReport>) {
    let real = replayed.classes(scenario.rule.limit);
    let sim = sluice_sim::run(scenario).policies.remove(0).classes;
    eprintln!(
        "real:\n{}\nsimulator:\n{}",
        sluice_sim::classes::markdown(&real),
        sluice_sim::classes::markdown(&sim)
    );
    (real, sim)
}

/// Each class but the bursty one admitted within 3% of the limit per key-window of what the
/// simulator admitted (and one request either way for the windows' edges).
fn agree_on_steady_classes(real: &[ClassReport], sim: &[ClassReport], limit: u64) {
    for s in sim.iter().filter(|c| c.class != "bursty") {
        let r = class(real, &s.class);
        let per_window = (r.admitted.abs_diff(s.admitted)) as f64 / r.windows.max(1) as f64;
        assert!(
            per_window <= 0.03 * limit as f64 + 1.0,
            "{}: real {} admitted, simulated {} over {} key-windows",
            s.class,
            r.admitted,
            s.admitted,
            r.windows
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_instances_hold_a_mix_of_users_class_by_class_and_agree_with_the_simulator() {
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios/mix/short.yaml");
    let scenario = sluice_sim::Scenario::load(&file).unwrap();
    let requests = sluice_sim::requests(&scenario);
    let fleet = fleet::Fleet::start(
        Path::new(env!("CARGO_BIN_EXE_sluice")),
        scenario.nodes.count,
        &sluice_sim::rule_file("predictive", &scenario),
        "",
    );
    // Every instance knows the fleet's size before the traffic starts.
    fleet.wait_until_all_known();
    let window = Duration::from_secs(scenario.rule.window_s);
    let real = fleet::replay(&fleet.http_ports(), &requests, window).await;
    assert_eq!(real.failed, 0, "{}", fleet.logs());
    let limit = scenario.rule.limit;
    let replayed = real;
    // Each busy key's windows (offered/admitted), for a failing check.
    let windows = |class: &str| {
        replayed
            .counts
            .iter()
            .filter(|((key, _), c)| key.starts_with(class) && c.offered > limit)
            .map(|((key, w), c)| format!("{key} w{w}: {}/{}", c.admitted, c.offered))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let late = replayed.late;
    let (real, sim) = real_and_simulated(&replayed, &scenario);
    // A request sent just before a window boundary may be decided just after it: the client's
    // tally of a key-window may hold one request of the next.
    let one = 100.0 / limit as f64;
    // The targets (docs/ACCURACY.md, "A mix of users"): at most 5% over the limit in any
    // window, no busy window of the pinned client under 95% of it, false denials of users
    // under their limit under 0.1% (0.2% here: on a loaded machine, one request in 3,500 late).
    // Not the tenant's key, which climbs past its limit in its first window as its users
    // arrive: not held to 5% (8% on 60 s windows, real and simulated; 0.0-12.5% here in
    // sixteen runs, docs/ACCURACY.md); 15% catches a regression.
    for c in real.iter().filter(|c| c.class != "bursty") {
        let bound = if c.class == "tenant" { 15.0 } else { 5.0 };
        assert!(
            c.over_max_pct <= bound + one,
            "{}: a window {:.1}% over the limit ({}; {late} requests sent late); the instances logged:\n{}",
            c.class,
            c.over_max_pct,
            windows(&c.class),
            fleet.logs()
        );
    }
    let pinned = class(&real, "pinned");
    assert!(pinned.busy_windows >= 2, "{pinned:?}");
    assert_eq!(pinned.under_admitted, 0, "{pinned:?}");
    let normal = class(&real, "normal");
    assert!(normal.false_denial_pct < 0.2, "{normal:?}");
    assert_eq!(class(&real, "churn").false_denials, 0);
    // The tenant's key at 3x the limit gets it; its users, far under theirs, are never refused
    // by their own rule.
    let tenant = class(&real, "tenant");
    assert!(tenant.busy_windows >= 2, "{tenant:?}");
    assert_eq!(tenant.under_admitted, 0, "{tenant:?}");
    assert_eq!(class(&real, "member").false_denials, 0);
    // Bursts a few times a window on every instance, quiet between: 0.0-4.2% over in eight
    // runs, the least busy window at 93-98% (5.0% over in each of two runs before a budget set
    // after a quiet span read the store first; 0-17% before the even split: docs/ACCURACY.md).
    // Not held to the 95% floor on these 12 s windows; this bound catches a regression.
    let bursty = class(&real, "bursty");
    assert!(
        bursty.over_max_pct <= 10.0 && bursty.busy_min_pct >= 85.0,
        "{bursty:?}"
    );
    // The simulator predicts each steady class within 3% of the limit per key-window (and one
    // request either way for the windows' edges).
    agree_on_steady_classes(&real, &sim, limit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_that_changes_under_load_holds_the_mix_and_agrees_with_the_simulator() {
    // Instance 4 joins at 12 s, instance 1 leaves (SIGTERM) at 18 s, instance 2 is killed
    // (SIGKILL) at 24 s, under the mix of `short.yaml`.
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios/mix/short-changing.yaml");
    let scenario = sluice_sim::Scenario::load(&file).unwrap();
    let requests = sluice_sim::requests(&scenario);
    let nodes = &scenario.nodes;
    let mut fleet = fleet::Fleet::start_some(
        Path::new(env!("CARGO_BIN_EXE_sluice")),
        nodes.count,
        &sluice_sim::rule_file("predictive", &scenario),
        "",
        |i| nodes.join_ns(i) == 0,
    );
    fleet.wait_until_all_known();
    let window = Duration::from_secs(scenario.rule.window_s);
    let ports = fleet.http_ports();
    let changes = fleet::changes(nodes);
    assert_eq!(changes.len(), 3, "{changes:?}");
    let replayed =
        fleet::replay_changing(&ports, &requests, window, &changes, |c| fleet.apply(c)).await;
    // A request in flight to the killed instance may fail; none to the others.
    assert!(
        replayed.failed <= 5,
        "{} failed: {}",
        replayed.failed,
        fleet.logs()
    );
    assert!(
        !fleet.instances[1].running() && !fleet.instances[2].running(),
        "the instances that left and crashed are stopped"
    );
    let limit = scenario.rule.limit;
    let late = replayed.late;
    let (real, sim) = real_and_simulated(&replayed, &scenario);
    let one = 100.0 / limit as f64;
    // Every class within the limit's 5% in every window (the bursty user: 10%, as on the
    // fleet that does not change), users under their limit not refused.
    for c in &real {
        let bound = if c.class == "bursty" { 10.0 } else { 5.0 };
        assert!(
            c.over_max_pct <= bound + one,
            "{}: a window {:.1}% over the limit ({late} requests sent late): {c:?}\n{}",
            c.class,
            c.over_max_pct,
            fleet.logs()
        );
    }
    assert!(class(&real, "normal").false_denial_pct < 0.2);
    assert_eq!(class(&real, "churn").false_denials, 0);
    assert_eq!(class(&real, "pinned").under_admitted, 0);
    // The simulator's joins, leaves and crashes are the real ones: each steady class within
    // 3% of the limit per key-window (and a request either way for the windows' edges).
    agree_on_steady_classes(&real, &sim, limit);
}
