//! Runs a simulator scenario twice, on real processes and in the simulator, and compares them
//! window by window (driven by `scripts/fleet-vs-sim.sh`; figures in docs/ACCURACY.md).
//!
//! `fleet_vs_sim SCENARIO [SLUICE_BINARY]`: for each synced policy of the scenario (`policies:`,
//! default `predictive`), starts a real Redis and one `sluice serve` per node with the rule the
//! simulator uses, replays the scenario's requests in real time (each to its node, starting at
//! a window boundary), then simulates the same requests, and prints per window the admitted
//! requests of both, per run the over-admission of first and warm key-windows and the store
//! commands per request, and, for a scenario whose keys fall in several classes (key
//! prefixes), both sides' figures per class.
//!
//! Nodes that join, leave or crash do so on the real side too: a joining node's `sluice serve`
//! starts a second before its join time (it takes a few hundred milliseconds to listen and
//! announce itself), a leaving one gets SIGTERM (its last flush, then it takes itself off the
//! fleet's list), a crashing one SIGKILL.
//!
//! The scenario's clock skews, store latency and outages are simulator-only: a scenario with
//! them is refused, since the real run could not reproduce them, except a store latency of at
//! most 1 ms: the round trip of the real run's own Redis on loopback, which a scenario should
//! name for the simulator to see what real instances see (flushes in flight while requests
//! are decided).

#[path = "../tests/common/fleet.rs"]
mod fleet;

use std::path::PathBuf;
use std::time::Duration;

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: fleet_vs_sim SCENARIO [SLUICE_BINARY]");
        std::process::exit(2);
    };
    let bin = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/release/sluice"));
    let scenario = sluice_sim::Scenario::load(std::path::Path::new(&path)).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    });
    let n = &scenario.nodes;
    let store = &scenario.store;
    if n.skew_ms.iter().any(|&s| s != 0)
        || store.latency_ms.is_some_and(|l| l.median > 1.0)
        || !store.outages.is_empty()
    {
        eprintln!(
            "{path}: clock skews, store latency over 1 ms and outages exist only in the simulator; this comparison runs scenarios without them"
        );
        std::process::exit(2);
    }
    let policies: Vec<String> = scenario
        .policies
        .clone()
        .unwrap_or_else(|| vec!["predictive".to_owned()])
        .into_iter()
        .filter(|p| p.starts_with("predictive") || p == "reactive")
        .collect();
    let requests = sluice_sim::requests(&scenario);
    let changes = fleet::changes(n);
    let window = Duration::from_secs(scenario.rule.window_s);
    let windows = scenario.duration_s.div_ceil(scenario.rule.window_s);
    let limit = scenario.rule.limit;
    let extra = n
        .expected
        .map(|e| format!("expected_instances: {e}\n"))
        .unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "{path}: {} nodes, limit {limit} per {} s, {} spans, {} requests",
        n.count,
        scenario.rule.window_s,
        scenario.rule.spans,
        requests.len()
    );
    for policy in policies {
        let rules = sluice_sim::rule_file(&policy, &scenario);
        let joins_first = |i: usize| n.join_ns(i) == 0;
        let mut fleet = fleet::Fleet::start_some(&bin, n.count, &rules, &extra, joins_first);
        // Every instance of the start knows the fleet's size before the traffic starts.
        fleet.wait_until_all_known();
        let commands_before = fleet.store_commands();
        let ports = fleet.http_ports();
        let real = runtime.block_on(fleet::replay_changing(
            &ports,
            &requests,
            window,
            &changes,
            |change| fleet.apply(change),
        ));
        let commands = fleet.store_commands().saturating_sub(commands_before);
        drop(fleet);
        let mut one = scenario.clone();
        one.policies = Some(vec![policy.clone()]);
        let sim = sluice_sim::run(&one);
        let sim = &sim.policies[0];
        println!("\npolicy {policy}: admitted per window (all keys)");
        println!("| window | real | simulator |\n|---:|---:|---:|");
        let real_by_window = real.admitted_by_window(windows);
        for (w, real) in real_by_window.iter().enumerate() {
            let simulated = sim.admitted_by_window.get(w).copied().unwrap_or(0);
            println!("| {} | {real} | {simulated} |", w + 1);
        }
        let (first, warm) = real.over_pct(limit);
        println!(
            "| over-admission, % of the limit | first windows max / p99 | warm windows max / p99 |\n|---|---:|---:|"
        );
        println!(
            "| real | {:.1} / {:.1} | {:.1} / {:.1} |",
            first.last().copied().unwrap_or(0.0),
            percentile(&first, 0.99),
            warm.last().copied().unwrap_or(0.0),
            percentile(&warm, 0.99)
        );
        println!(
            "| simulator | {:.1} / {:.1} | {:.1} / {:.1} |",
            sim.first_over_max_pct,
            sim.first_over_p99_pct,
            sim.warm_over_max_pct,
            sim.warm_over_p99_pct
        );
        let sent: u64 = real.counts.values().map(|c| c.offered).sum();
        println!(
            "| store commands per request | {:.4} (real) | {:.4} (simulator) |",
            commands as f64 / sent.max(1) as f64,
            sim.store_commands_per_request
        );
        if sim.classes.len() > 1 {
            println!(
                "\nper class, real processes:\n\n{}",
                sluice_sim::classes::markdown(&real.classes(limit))
            );
            println!(
                "per class, simulator:\n\n{}",
                sluice_sim::classes::markdown(&sim.classes)
            );
        }
        if real.failed > 0 || real.late > 0 {
            println!(
                "(real run: {} requests failed, {} sent more than 20 ms late)",
                real.failed, real.late
            );
        }
    }
}
